"""What MindSpore 2.10's CPU kernels charge for a view, a broadcast and their copying alternatives (issue
"Performance I"): the measurements behind ``core.model.layers._heads_first`` and ``apply_rope``.

    .venv/bin/python benchmarks/view_ops.py [--shape 8 4 64 64] [--repeats 40]

Each row is a compiled graph (``mindspore.jit``) of 10 chained copies of one pattern on a float32 tensor of
``--shape`` (B, N, S, E), timed after 40 warm-up calls (MindSpore's CPU runtime tunes its first ~50 launches);
microseconds per pattern. The RoPE rows are one forward (+ backward) of the rotation as the model wrote it before
and writes it now; their outputs and gradients are compared to the last bit.
"""

from __future__ import annotations

import argparse
import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, ops
from provenance import cpu_info, git_commit

from core.model.layers import apply_rope


def timed(fn, args, repeats: int, inner: int = 1) -> tuple[float, object]:
    """(microseconds per call of ``mindspore.jit(fn)`` / ``inner``, its output)."""
    graph = ms.jit(fn)
    for _ in range(40):
        graph(*args)
    ms.runtime.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        out = graph(*args)
    ms.runtime.synchronize()
    return (time.perf_counter() - start) / repeats / inner * 1e6, out


def chained(step):
    """fn(x, *rest) applying ``step`` 10 times: one graph, ten launches of the pattern."""

    def fn(x, *rest):
        for _ in range(10):
            x = step(x, *rest)
        return x

    return fn


def _square(x):
    return x * x


def _times(x, r):
    return x * r


def _times_broadcast(x, r):
    return x * ops.broadcast_to(r, x.shape)


def _permute_view(x):
    return mint.permute(x, (0, 2, 1, 3)) + 1.0


def _transpose_kernel(x):
    return ops.transpose(x, (0, 2, 1, 3)) + 1.0


def _split_views(x):
    a, b = mint.split(x, x.shape[-1] // 2, dim=-1)
    return mint.cat((a + 1.0, b + 1.0), dim=-1)


def _split_kernel(x):
    a, b = ops.split(x, x.shape[-1] // 2, axis=-1)
    return ops.concat((a + 1.0, b + 1.0), axis=-1)


def rope_before(x, cos, sin):
    x1, x2 = mint.split(x, x.shape[-1] // 2, dim=-1)
    return mint.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def rope_now(x, cos, sin):
    return apply_rope(x, cos, sin)


def with_grad(rope):
    """fn(x, cos, sin) -> (loss, dloss/dx) of loss = sum(rope(x) * x)."""

    def fn(x, cos, sin):
        def loss(x):
            return (rope(x, cos, sin) * x).sum()

        return ms.value_and_grad(loss)(x)

    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=4, default=[8, 4, 64, 64], metavar=("B", "N", "S", "E"))
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    B, N, S, E = args.shape
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((B, N, S, E), np.float32))
    row = Tensor(rng.random((B, N, S, 1), np.float32))
    cos, sin = (Tensor(rng.random((S, E // 2), np.float32)) for _ in range(2))
    n = args.repeats

    rows = [
        ("same-shape multiply", chained(_square), (x,)),
        ("multiply by a (B, N, S, 1) operand (broadcast)", chained(_times), (x, row)),
        ("multiply by ops.broadcast_to of it", chained(_times_broadcast), (x, row)),
        ("mint.permute (view) + add", chained(_permute_view), (x,)),
        ("ops.transpose (kernel) + add", chained(_transpose_kernel), (x,)),
        ("mint.split (views) + add + cat", chained(_split_views), (x,)),
        ("ops.split (kernel) + add + concat", chained(_split_kernel), (x,)),
    ]
    print(
        f"\n**View ops** — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {git_commit()}, "
        f"{cpu_info()}; float32 {tuple(args.shape)}, jit, means of {n} calls\n"
    )
    print("| pattern | us per pattern |\n|---|---:|")
    for name, fn, inputs in rows:
        print(f"| {name} | {timed(fn, inputs, n, inner=10)[0]:.0f} |", flush=True)
    for name, fn in (("RoPE forward, before", rope_before), ("RoPE forward, now", rope_now)):
        print(f"| {name} | {timed(fn, (x, cos, sin), n)[0]:.0f} |", flush=True)
    outs = {}
    for name, rope in (("before", rope_before), ("now", rope_now)):
        us, outs[name] = timed(with_grad(rope), (x, cos, sin), n)
        print(f"| RoPE forward + backward, {name} | {us:.0f} |", flush=True)
    same = all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(outs["before"], outs["now"], strict=True))
    print(f"\nRoPE before and now, value and gradient bit-identical: {same}")


if __name__ == "__main__":
    main()
