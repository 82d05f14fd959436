"""Does MindSpore's compile cache give back the graph it saved? Start-up (issue "Performance I").

    .venv/bin/python benchmarks/compile_cache.py [--trials]

``--trials``: then real trials (``core.runtime.compile_cache``) for a few layouts, each run three times in one cache: the
first compiles and saves its graphs, the second loads them, the third has the cache off; prints each run's
start-up, first step and whether the losses, validation loss and gradient norm are the same to the bit.

MindSpore saves a compiled ``jit`` graph under ``MS_COMPILER_CACHE_PATH`` when ``MS_COMPILER_CACHE_ENABLE=1`` and
loads it in the next process instead of compiling. Each variant below runs twice in fresh processes sharing one
cache directory (the first compiles and saves, the second loads) and prints the loss and gradient norms of a
two-layer model, then again after the weights changed in place, so a graph that lost its weights shows.

Variants (how the graph reaches the model's Parameters):
- ``closure``: ``mindspore.jit`` of a function that closes over the model (as ``core.runtime.graphs.jit`` compiles the
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
        step = ms.jit(grad) if variant == "closure" else Compiled(grad, [net] if variant == "cell" else [])

    def measure():
        loss, grads = step(x)
        return [float(loss)] + [float(ops.norm(g)) for g in grads]

    t0 = time.perf_counter()
    first = measure()
    first_call = time.perf_counter() - t0
    ops.assign(net.w1, net.w1 * 0.5)  # the graph must read the weights as they are now
    return {"first_call_sec": round(first_call, 3), "before": first, "after_change": measure()}


LAYOUTS = {
    "tiny, 1 rank": ["model=tiny"],
    "tiny, tp=2 + sp": ["model=tiny", "parallel.tp=2", "parallel.sp=true"],
    "tiny (4 layers), pp=2": ["model=tiny", "model.n_layers=4", "parallel.pp=2", "training.micro_batch_size=2"],
    "tiny, dp_shard=2, Muon, full recompute": [
        "model=tiny",
        "optim=muon",
        "parallel.dp_shard=2",
        "memory.recompute=full",
    ],
}


def trials() -> None:
    from pathlib import Path

    from provenance import cpu_info, git_commit

    root = Path(__file__).resolve().parents[1]
    print(f"\ntrials, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {git_commit()}, {cpu_info()}")
    print("| layout | run | graphs | start-up (s) | first step (s) | peak MiB | same numbers as the first run |")
    print("|---|---|---|---:|---:|---:|---|")
    for name, overrides in LAYOUTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, MSAR_COMPILE_CACHE_DIR=str(Path(tmp) / "cache"), GLOG_v="3")
            runs = []
            for run, extra in (("compiles", []), ("loads", []), ("cache off", ["execution.compile_cache=false"])):
                out = Path(tmp) / run.replace(" ", "_")
                subprocess.run(
                    [sys.executable, "-m", "core.train", *overrides, *extra, "trial.max_steps=4", f"trial.dir={out}"],
                    cwd=root,
                    env=env,
                    capture_output=True,
                )
                s = json.loads((out / "trial_summary.json").read_text())
                m = s["metrics"]
                rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
                numbers = ([r["loss"] for r in rows if "loss" in r], m["val_loss"], m["grad_norm_last"])
                runs.append(numbers)
                print(
                    f"| {name} | {run} | {s['compile_cache'] or 'compiled, not saved'} | {s['startup_sec']:.1f} | "
                    f"{s['startup_phases_sec']['first_step']:.2f} | {m['peak_memory_bytes'] / 2**20:.0f} | "
                    f"{'yes' if numbers == runs[0] else 'NO'} |",
                    flush=True,
                )


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return 0
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=cache, GLOG_v="3")
            runs = [
                json.loads(
                    subprocess.run(
                        [sys.executable, __file__, "--child", variant],
                        env=env,
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout.splitlines()[-1]
                )
                for _ in ("compiles", "loads")
            ]
        same = all(
            abs(a - b) <= 1e-6 * max(1.0, abs(a))
            for key in ("before", "after_change")
            for a, b in zip(runs[0][key], runs[1][key], strict=True)
        )
        print(
            f"{variant:>20}: first call {runs[0]['first_call_sec']:.3f} s compiled, "
            f"{runs[1]['first_call_sec']:.3f} s from the cache; "
            f"{'the same numbers' if same else 'DIFFERENT numbers'} "
            f"(loss {runs[0]['before'][0]:.4f} vs {runs[1]['before'][0]:.4f}, "
            f"after the change {runs[0]['after_change'][0]:.4f} vs {runs[1]['after_change'][0]:.4f})"
        )
    if "--trials" in sys.argv:
        trials()
    return 0


if __name__ == "__main__":
    sys.exit(main())
