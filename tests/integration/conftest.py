import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

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


def run_trial(trial_dir: Path, *overrides: str, timeout: float = 300) -> TrialRun:
    proc = subprocess.run([sys.executable, "-m", "core.train", *overrides, f"trial.dir={trial_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    return TrialRun(proc.returncode, trial_dir, proc.stdout + proc.stderr)


@pytest.fixture
def trial(tmp_path):
    counter = iter(range(100))
    return lambda *overrides, **kw: run_trial(tmp_path / f"t{next(counter)}", *overrides, **kw)


def kill_rank_mid_run(trial_dir: Path, rank: int, *overrides: str) -> TrialRun:
    """Start a long trial, SIGKILL one rank once two steps are logged, and return how the trial ended."""
    proc = subprocess.Popen([sys.executable, "-m", "core.train", "model=tiny", "trial.max_steps=100000", *overrides,
                             f"trial.dir={trial_dir}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    metrics = trial_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.5)
    assert metrics.exists(), "the run never reached step 2"
    os.kill(json.loads((trial_dir / "logs" / "pids.json").read_text())["ranks"][str(rank)], signal.SIGKILL)
    out, _ = proc.communicate(timeout=180)
    return TrialRun(proc.returncode, trial_dir, out)
