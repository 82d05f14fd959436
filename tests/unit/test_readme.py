"""The README's two commands are what CI runs: keep them in step."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_commands():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    setup_and_run, tests = blocks[0].strip(), blocks[1].strip()
    assert "-m autoresearch.agent" in setup_and_run
    setup = setup_and_run.split(" && .venv/bin/python -m autoresearch.agent")[0]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert setup in ci and tests in ci
