"""Helpers for tests that run the agent as a process over the fake trial (tests/fake_trial.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FAKE = shlex.join([sys.executable, str(ROOT / "tests" / "fake_trial.py")])


def wait_for(predicate, timeout=60.0, what=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def space_file(tmp_path: Path, name: str, params: dict[str, list], fixed: dict | None = None) -> Path:
    """A space of ``choice`` params (name -> values) over the fake trial, maximizing tokens/s."""
    space = tmp_path / f"{name}.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "trial_command": "other",
                "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
                "fixed": {"trial.max_wall_time_sec": 120, **(fixed or {})},
                "params": {k: {"type": "choice", "values": v} for k, v in params.items()},
            }
        )
    )
    return space


def held_space(
    tmp_path: Path, name: str, params: dict[str, list], fixed: dict | None = None
) -> tuple[Path, Path, Path]:
    """A space of ``choice`` params (name -> values) whose fake trials wait while ``hold`` exists and append a
    line to ``marker`` as they start. Returns (space, hold, marker)."""
    hold, marker = tmp_path / "hold", tmp_path / "started"
    fixed = {"fake.hold": str(hold), "fake.marker": str(marker), **(fixed or {})}
    return space_file(tmp_path, name, params, fixed), hold, marker


def start_agent(tmp_path: Path, space: Path, *args: str) -> subprocess.Popen:
    """``python -m autoresearch.agent`` over the fake trial, without an API key, output captured; no
    confirmation phase unless ``args`` ask for one (these tests count the search's trials)."""
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoresearch.agent",
            "--space",
            str(space),
            "--trials-dir",
            str(tmp_path / "trials"),
            "--command",
            FAKE,
            "--estimator",
            "none",
            "--confirm",
            "0",
            *args,
        ],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def started(marker: Path) -> list[str]:
    return marker.read_text().splitlines() if marker.exists() else []
