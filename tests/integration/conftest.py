import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from core import ckpt as ck
from core.trial import fork_server
from tests.schema import assert_summary_schema

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class TrialRun:
    code: int
    dir: Path
    output: str

    @property
    def summary(self) -> dict:
        return json.loads((self.dir / "trial_summary.json").read_text())

    def metrics(self, key: str = "loss") -> list[float]:
        rows = [json.loads(line) for line in (self.dir / "metrics.jsonl").read_text().splitlines()]
        return [r[key] for r in rows if key in r]


def run_trial(trial_dir: Path, *overrides: str, timeout: float = 300, env: dict | None = None) -> TrialRun:
    """``python -m core.train`` from the project root; ``env``: variables added to this process's. When they name
    a warm server (the ``warm`` fixture), the trial is forked from it, its supervisor or single rank as well as a
    multi-rank trial's scheduler and ranks; its output then goes through a file (a forked process takes no pipe)."""
    command = [sys.executable, "-m", "core.train", *overrides, f"trial.dir={trial_dir}"]
    env = {**os.environ, **(env or {})}
    if fork_server.SOCKET_ENV not in env:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        return TrialRun(proc.returncode, trial_dir, proc.stdout + proc.stderr)
    with tempfile.TemporaryFile("w+") as out:
        proc = fork_server.popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:  # as subprocess.run ends it
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        out.seek(0)
        return TrialRun(code, trial_dir, out.read())


@pytest.fixture(scope="session")
def warm():
    """``run_trial``'s ``env`` that forks a multi-rank trial's scheduler and ranks from one warm server
    (``core.trial.fork_server``, as the agent runs them) instead of importing MindSpore in each: seconds of CPU
    per process, much of a layout suite's time on two cores. For the suites whose claim is the numbers a layout
    computes (tests/integration/test_warm_trials.py checks warm trials against cold ones); not exported to this
    process's environment, so that trials other tests start (in network namespaces, under Slurm) stay cold."""
    with fork_server.serving() as address:
        os.environ.pop(fork_server.SOCKET_ENV, None)
        yield {fork_server.SOCKET_ENV: address}


@pytest.fixture
def trial(tmp_path):
    counter = iter(range(100))
    return lambda *overrides, **kw: run_trial(tmp_path / f"t{next(counter)}", *overrides, **kw)


def kill_rank_mid_run(trial_dir: Path, rank: int, *overrides: str) -> TrialRun:
    """Start a long trial, SIGKILL one rank once two steps are logged, and return how the trial ended."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "core.train",
            "model=tiny",
            "trial.max_steps=100000",
            *overrides,
            f"trial.dir={trial_dir}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = trial_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.5)
    assert metrics.exists(), "the run never reached step 2"
    os.kill(json.loads((trial_dir / "logs" / "pids.json").read_text())["ranks"][str(rank)], signal.SIGKILL)
    out, _ = proc.communicate(timeout=180)
    return TrialRun(proc.returncode, trial_dir, out)


def trial_cache(root: Path, base: tuple[str, ...], timeout: float = 900, env: dict | None = None):
    """``get(*overrides)``: the trial of ``base`` + overrides, run once under ``root`` and reused (a module's tests
    compare many layouts with a few references)."""
    runs: dict = {}

    def get(*overrides: str) -> TrialRun:
        if overrides not in runs:
            runs[overrides] = run_trial(root / f"run{len(runs)}", *base, *overrides, timeout=timeout, env=env)
        return runs[overrides]

    return get


def assert_layout_reproduces(run: TrialRun, ref: TrialRun, steps: int, pp: int) -> None:
    """``run`` ended ok with a valid summary of ``pp`` stages, and equals ``ref`` (``assert_same_run``)."""
    assert ref.code == 0, ref.output
    assert run.code == 0, run.output + "".join(p.read_text()[-2000:] for p in (run.dir / "logs").glob("rank_*.log"))
    s = run.summary
    assert_summary_schema(s)
    assert s["layout"]["pp"] == pp
    assert s["layout"]["world_size"] == len(s["metrics"]["peak_memory_bytes_per_rank"])
    assert_same_run(run, ref, steps)


def losses(run: TrialRun) -> dict[int, float]:
    rows = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def final_params(run: TrialRun, step: int) -> dict[str, np.ndarray]:
    tensors, _ = ck.load(run.dir / "checkpoints" / f"step_{step:08d}")  # consolidated if sharded
    return {k: v for k, v in tensors.items() if k.startswith("model.")}


def assert_same_run(run: TrialRun, ref: TrialRun, steps: int, first_step: int = 1) -> None:
    """Per-step losses and the validation loss within 1e-5 relative, final parameters (consolidated) too."""
    got, want = losses(run), losses(ref)
    assert sorted(got) == list(range(first_step, steps + 1))
    for step, value in got.items():
        assert value == pytest.approx(want[step], rel=1e-5), f"step {step}"
    assert run.summary["metrics"]["val_loss"] == pytest.approx(ref.summary["metrics"]["val_loss"], rel=1e-5)
    # Parameters norm-wise: fp32 sums in another order differ by ~1e-7 per step, and AdamW divides each element's
    # gradient by its own magnitude, so on elements whose gradient nearly cancels the noise grows relative to the
    # element; over 10 steps the model as a whole stays within 1e-5 (measured ~2e-6), single tensors within 1e-4.
    a, b = final_params(run, steps), final_params(ref, steps)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].shape == b[k].shape and np.linalg.norm(a[k] - b[k]) <= 1e-4 * np.linalg.norm(b[k]), k
    diff = np.sqrt(sum(np.sum((a[k] - b[k]) ** 2.0) for k in a))
    assert diff <= 1e-5 * np.sqrt(sum(np.sum(b[k] ** 2.0) for k in b))
