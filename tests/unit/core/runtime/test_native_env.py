"""core.runtime.native_env: variables MindSpore's libraries read as they load are in a trial's environment before they do."""

import os
import subprocess
import sys
from pathlib import Path

from core.runtime import native_env

ROOT = str(Path(__file__).resolve().parents[4])


def test_defaults_fill_in_and_a_users_value_wins(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    native_env.apply()
    assert os.environ["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    native_env.apply()
    assert os.environ["OMP_NUM_THREADS"] == "2"


def test_a_trial_process_sets_them_before_mindspore_loads():
    """core.train's entry applies them first thing, while MindSpore (and its libgomp) is not loaded yet."""
    code = (
        "import os, sys\nimport core.train as t\nt.main(['--help'])\n"
        "print(os.environ.get('OMP_NUM_THREADS'), 'mindspore' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "1 False"
