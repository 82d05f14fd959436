"""Where a training step's time goes (issue "Performance I", item 2): phases, then the hottest ops.

    .venv/bin/python benchmarks/step_breakdown.py [--model small] [--steps 30] [--warmup 60] [overrides ...]

One process builds the trainer of ``core.train`` (same config, same model, same compiled functions), runs
``--warmup`` steps (compilation and MindSpore's CPU thread-count search, docs/mindspore-cpu.md "Threads and speed") and then times each
phase of ``Trainer._train_step`` in turn, waiting for the device after each (``mindspore.runtime.synchronize``):

- data: the step's batch cut from the corpus and handed to the rank (host NumPy);
- forward+backward: the compiled loss-and-gradient graph of each micro-batch (and their accumulation);
- loss to host: reading the loss back (a host sync; the NaN check needs it);
- sync+clip: the gradient-sync graph (reduction over ranks, scaling, global-norm clipping);
- norm to host: reading the norm back (the other host sync);
- optimizer: the update graph.

Each phase includes the Python that calls its graph; means over steps, so the phases add up to the step.

Then ``--steps`` more steps run under MindSpore's profiler (core.runtime.profiling) for time per op type, as a share of
the profiled steps' wall time (the profiler slows steps and inflates many small kernels; its shares, not its
times, are the figure). The time the kernels are not busy is launch gaps, Python and waiting.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provenance import cpu_info, git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PHASES = ("data", "forward+backward", "loss to host", "sync+clip", "norm to host", "optimizer")


def timed_step(trainer, step: int, sync) -> dict[str, float]:
    """One training step of ``trainer`` (the phases of ``Trainer._train_step``), seconds per phase."""
    import mindspore as ms

    from core.optim import lr_at

    cfg, t, dims, sched = trainer.cfg, trainer.cfg.training, trainer.dims, trainer.step
    out: dict[str, float] = {}
    start = last = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal last
        sync()
        now = time.perf_counter()
        out[name] = out.get(name, 0.0) + now - last
        last = now

    rows = trainer.train_data.batch(
        step, t.global_batch_size, t.seq_len, cfg.seed, rank=dims.index("batch"), world_size=dims.size("batch")
    )
    micro = list(sched._micro_batches(*trainer.par.local_tokens(rows)))
    mark("data")
    grads = None
    for x, y in micro:
        loss, g = sched.grad_fn(x, y, trainer.positions)
        grads = g if grads is None else sched._add(ms.mutable(grads), ms.mutable(g))
        mark("forward+backward")
        float(loss.asnumpy())
        mark("loss to host")
    grads, norm, scale = trainer.sync(grads)
    mark("sync+clip")
    float(norm.asnumpy())
    mark("norm to host")
    trainer.optimizer.step(grads, lr_at(step, cfg.optim, cfg.trial.max_steps), scale)
    mark("optimizer")
    out["step"] = time.perf_counter() - start
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--keep", help="a directory to leave the profiler output in")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    from core.runtime import native_env

    native_env.apply()  # as core.train does, before MindSpore loads
    import mindspore as ms

    from core.config import load_config, to_dict
    from core.runtime.profiling import StepProfiler
    from core.training.step import AccumulationStep
    from core.training.trainer import Trainer
    from core.trial import TrialRecorder

    overrides = [f"model={args.model}", f"trial.max_steps={args.warmup + 2 * args.steps}", *args.overrides]
    cfg = load_config(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        keep = os.path.abspath(args.keep) if args.keep else None
        os.chdir(tmp)  # MindSpore's compile debris (graph-kernel fusion's kernels and logs) goes to the cwd
        rec = TrialRecorder(trial_dir=Path(tmp), config=to_dict(cfg), overrides=overrides, started=time.time())
        trainer = Trainer(cfg, rec)
        if not isinstance(trainer.step, AccumulationStep):
            raise SystemExit("the breakdown covers the plain micro-batch schedule (no pipeline, no segments)")
        for step in range(args.warmup):
            trainer._train_step(step)
        rows = [timed_step(trainer, args.warmup + i, ms.runtime.synchronize) for i in range(args.steps)]
        profiler = StepProfiler(Path(tmp) / "profile")
        profiler.start()
        t0 = time.perf_counter()
        for i in range(args.steps):
            trainer._train_step(args.warmup + args.steps + i)
        wall_ms = (time.perf_counter() - t0) * 1000
        op_ms = profiler.stop()
        if keep:
            shutil.copytree(Path(tmp) / "profile", keep, dirs_exist_ok=True)
        os.chdir(ROOT)  # out of the directory about to be removed

    step = statistics.mean(r["step"] for r in rows)
    mean = {p: statistics.mean(r.get(p, 0.0) for r in rows) for p in PHASES}
    print(
        f"\n**Step breakdown** — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {git_commit()}, "
        f"{cpu_info()}; `{' '.join(overrides[:1] + args.overrides)}` (batch {cfg.training.global_batch_size} x "
        f"{cfg.training.seq_len}, {cfg.optim.name}), means of {args.steps} steps after {args.warmup}\n"
    )
    print("| phase | ms | share |\n|---|---:|---:|")
    for p in PHASES:
        print(f"| {p} | {mean[p] * 1000:.1f} | {mean[p] / step:.0%} |")
    print(f"| **step** | **{step * 1000:.1f}** | |")
    total = sum(op_ms.values())
    print(
        f"\nHottest op types under the profiler ({args.steps} steps, {wall_ms:.0f} ms wall; ops "
        f"{total:.0f} ms = {total / wall_ms:.0%} of it):\n"
    )
    print("| op type | ms per step | share of wall |\n|---|---:|---:|")
    for op, ms_ in sorted(op_ms.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {op} | {ms_ / args.steps:.1f} | {ms_ / wall_ms:.1%} |")


if __name__ == "__main__":
    main()
