"""How long MindSpore 2.10 takes to compile a graph over one tensor per parameter, by how the graph is spelled
(issue "Performance I", start-up): the measurements behind ``core.runtime.graphs.each``.

    .venv/bin/python benchmarks/compile_time.py [--tensors 60] [--shape 64 64]

Each row compiles (``mindspore.jit``, jit_level O0) one function of a tuple of ``--tensors`` float32 tensors in
a fresh process, after a small warm-up graph (the first compile of a process pays one-time costs), and reports
the seconds of that first call. Rows compute the same values: scale every tensor (``scale``), the weighted sum
of squares the gradient clipping takes (``norm``), one in-place update per parameter (``update``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from provenance import cpu_info, git_commit

SPELLINGS = {
    "scale": ("generator expression", "for loop over indices", "execution.each"),
    "norm": ("for loop over indices", "execution.each + AddN"),
    "update": ("for loop over indices", "execution.each"),
}


def _child(task: str, spelling: str, n: int, shape: tuple[int, ...]) -> float:
    import mindspore as ms
    import numpy as np
    from mindspore import Parameter, ParameterTuple, nn, ops

    from core.runtime import graphs as execution

    sgd = ops.ApplyGradientDescent()
    weights = tuple(float(i % 3) for i in range(n))

    def sum_of_squares(x):
        return ops.sum(ops.square(x))

    def weighted(g, w):
        return sum_of_squares(g) * w

    def step(p, g):
        sgd(p, 0.1, g)
        return 0

    class Graph(nn.Cell):
        def __init__(self):
            super().__init__()
            self.params = ParameterTuple(
                [Parameter(ms.Tensor(np.zeros(shape, np.float32)), name=f"p{i}") for i in range(n)]
            )

        def construct(self, grads):
            if task == "scale":
                if spelling == "generator expression":
                    return tuple(g * 2.0 for g in grads)
                if spelling == "for loop over indices":
                    out = ()
                    for i in range(n):
                        out = out + (grads[i] * 2.0,)
                    return out
                return execution.each(ops.partial(ops.mul, 2.0), grads)
            if task == "norm":
                if spelling == "for loop over indices":
                    total = weighted(grads[0], weights[0])
                    for i in range(1, n):
                        total = total + weighted(grads[i], weights[i])
                    return total
                return ops.addn(execution.each(weighted, grads, weights))
            if spelling == "for loop over indices":
                for i in range(n):
                    sgd(self.params[i], 0.1, grads[i])
            else:
                execution.each(step, self.params, grads)
            return grads[0]

    def double(x):
        return x * 2

    ms.jit(double)(ms.Tensor(np.ones(4, np.float32)))
    grads = ms.mutable(tuple(ms.Tensor(np.ones(shape, np.float32)) for _ in range(n)))
    graph = ms.jit(Graph().construct, jit_level="O0")
    start = time.perf_counter()
    graph(grads)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=60)
    ap.add_argument("--shape", type=int, nargs="+", default=[64, 64])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    shape = tuple(args.shape)
    if args.child:
        print(_child(*args.child, args.tensors, shape))
        return
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {git_commit()}, {cpu_info()}")
    print(f"{args.tensors} float32 tensors of {shape}, seconds to compile (first call), each in a fresh process\n")
    print("| graph | spelling | compile (s) |\n|---|---|---:|")
    for task, spellings in SPELLINGS.items():
        for spelling in spellings:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--tensors",
                    str(args.tensors),
                    "--shape",
                    *map(str, shape),
                    "--child",
                    task,
                    spelling,
                ],
                capture_output=True,
                text=True,
            )
            if out.returncode:
                raise SystemExit(f"{task} / {spelling} failed:\n{out.stderr[-2000:]}")
            print(f"| {task} | {spelling} | {float(out.stdout.strip().splitlines()[-1]):.2f} |")


if __name__ == "__main__":
    main()
