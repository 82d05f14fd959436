"""Which kernels a bf16 training step needs does MindSpore have on this CPU, and at what speed (issue "Real
models", bf16 mixed precision): every op the core's forward and backward use, run on bf16, fp16 and fp32 inputs;
the matmul timed in each dtype that has one.

    .venv/bin/python benchmarks/bf16_cpu.py

Prints a markdown table (op x dtype: ok, or MindSpore's refusal) and the matmul times; the figures go to
benchmarks/RESULTS.md, "bf16 on CPU". Each cell runs in a process of its own: after one dtype's refusal, the same
op was seen to fail for the next dtype too in the same process.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, ops
from provenance import git_commit

ms.set_device("CPU")
N = 512
X = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
IDX = Tensor(np.array([1, 2, 3], np.int32))
# The core's kernels (core/model/layers.py, core/model/loss.py): forward ones, and what their gradients call.
OPS = {
    "MatMul (linear)": lambda x: ops.MatMul(transpose_b=True)(x, x),
    "BatchMatMul (attention)": lambda x: ops.BatchMatMul()(x.reshape(2, N // 2, N), x.reshape(2, N, N // 2)),
    "Softmax": lambda x: mint.softmax(x, dim=-1),
    "Sigmoid (SwiGLU)": ops.sigmoid,
    "Rsqrt (RMSNorm)": mint.rsqrt,
    "Mul": lambda x: x * x,
    "Add": lambda x: x + x,
    "ReduceSum": lambda x: x.sum(axis=-1),
    "Gather (embedding)": lambda x: ops.gather(x, IDX, 0),
    "Transpose": lambda x: ops.transpose(x, (1, 0)),
    "Cast to fp32": lambda x: x.astype(ms.float32),
}
DTYPES = {"bf16": ms.bfloat16, "fp16": ms.float16, "fp32": ms.float32}


def runs(name: str, dtype: str) -> str:
    """The cell in a fresh process."""
    done = subprocess.run([sys.executable, __file__, "--one", name, dtype], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"**no**: exit {done.returncode}"


def one(name: str, dtype: str) -> None:
    try:
        OPS[name](Tensor(X).astype(DTYPES[dtype])).astype(ms.float32).asnumpy()
        print("ok")
    except Exception as exc:  # noqa: BLE001 — the refusal is the finding
        print("**no**: " + (str(exc).splitlines() or [type(exc).__name__])[0][:70])


def matmul_ms(dtype) -> float | None:
    x = Tensor(X).astype(dtype)
    try:
        ops.MatMul(transpose_b=True)(x, x).astype(ms.float32).asnumpy()
    except Exception:  # noqa: BLE001 — no kernel: no time
        return None
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(10):
            y = ops.MatMul(transpose_b=True)(x, x)
        y.astype(ms.float32).asnumpy()
        best = min(best, (time.perf_counter() - t) / 10 * 1000)
    return best


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one(*sys.argv[2:4])
        return
    print(
        f"# bf16 kernels on CPU — {time.strftime('%Y-%m-%d')}, commit {git_commit()}, MindSpore {ms.__version__}, "
        f"{platform.processor() or platform.machine()}\n"
    )
    print("| op | " + " | ".join(DTYPES) + " |\n|---|" + "---|" * len(DTYPES))
    for name in OPS:
        print(f"| {name} | " + " | ".join(runs(name, dt) for dt in DTYPES) + " |")
    times = {k: matmul_ms(dt) for k, dt in DTYPES.items()}
    print(
        f"\n{N}x{N} matmul, best of 5 x 10: "
        + ", ".join(f"{k} {'no kernel' if v is None else f'{v:.2f} ms'}" for k, v in times.items())
    )


if __name__ == "__main__":
    main()
