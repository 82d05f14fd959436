"""Does MindSpore's compile cache give back the graph it saved? A lead for start-up (issue "Performance I").

    .venv/bin/python benchmarks/compile_cache.py

MindSpore saves a compiled ``jit`` graph under ``MS_COMPILER_CACHE_PATH`` when ``MS_COMPILER_CACHE_ENABLE=1`` and
loads it in the next process instead of compiling. Each variant below runs twice in fresh processes sharing one
cache directory (the first compiles and saves, the second loads) and prints the loss and gradient norms of a
two-layer model, then again after the weights changed in place, so a graph that lost its weights shows.

Variants (how the graph reaches the model's Parameters):
- ``closure``: ``mindspore.jit`` of a function that closes over the model (as ``core.execution.jit`` compiles the
  trainer's gradient graph today);
- ``inputs``: the weights passed in as the graph's arguments;
- ``cell``: the function run by a ``Cell`` whose ``construct`` is compiled and which holds the model as a child,
  so that the Parameters are the cell's own;
- ``cell-without-model``: the same cell, not holding the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

VARIANTS = ("closure", "inputs", "cell", "cell-without-model")


def child(variant: str) -> dict:
    import mindspore as ms
    import numpy as np
    from mindspore import Parameter, Tensor, nn, ops

    def loss_of(x, w1, w2):
        return ((ops.tanh(x @ w1) @ w2) ** 2).mean()

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(0)
            self.w1 = Parameter(Tensor(rng.standard_normal((16, 32)).astype(np.float32)), name="w1")
            self.w2 = Parameter(Tensor(rng.standard_normal((32, 4)).astype(np.float32)), name="w2")

        def construct(self, x):
            return loss_of(x, self.w1, self.w2)

    class Compiled(nn.Cell):
        def __init__(self, fn, held):
            super().__init__()
            self.fn = fn
            if held:
                self.held = nn.CellList(held)

        @ms.jit
        def construct(self, *args):
            return self.fn(*args)

    net, x = Net(), Tensor(np.ones((8, 16), np.float32))
    if variant == "inputs":
        compiled = ms.jit(ms.value_and_grad(loss_of, (1, 2)))

        def step(x):
            return compiled(x, net.w1, net.w2)
    else:
        grad = ms.value_and_grad(net, None, net.trainable_params())
        step = (ms.jit(grad) if variant == "closure"
                else Compiled(grad, [net] if variant == "cell" else []))

    def measure():
        loss, grads = step(x)
        return [float(loss)] + [float(ops.norm(g)) for g in grads]

    t0 = time.perf_counter()
    first = measure()
    first_call = time.perf_counter() - t0
    ops.assign(net.w1, net.w1 * 0.5)  # the graph must read the weights as they are now
    return {"first_call_sec": round(first_call, 3), "before": first, "after_change": measure()}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return 0
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=cache, GLOG_v="3")
            runs = [json.loads(subprocess.run([sys.executable, __file__, "--child", variant], env=env, check=True,
                                              capture_output=True, text=True).stdout.splitlines()[-1])
                    for _ in ("compiles", "loads")]
        same = all(abs(a - b) <= 1e-6 * max(1.0, abs(a)) for key in ("before", "after_change")
                   for a, b in zip(runs[0][key], runs[1][key]))
        print(f"{variant:>20}: first call {runs[0]['first_call_sec']:.3f} s compiled, "
              f"{runs[1]['first_call_sec']:.3f} s from the cache; "
              f"{'the same numbers' if same else 'DIFFERENT numbers'} "
              f"(loss {runs[0]['before'][0]:.4f} vs {runs[1]['before'][0]:.4f}, "
              f"after the change {runs[0]['after_change'][0]:.4f} vs {runs[1]['after_change'][0]:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
