import json
import subprocess
import sys
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
