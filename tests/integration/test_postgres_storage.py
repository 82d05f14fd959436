"""--storage postgresql://: two agents (as on two machines) share one study in a real PostgreSQL server."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autoresearch.report import table as report
from autoresearch.study import storage

ROOT = Path(__file__).resolve().parents[2]
FAKE = shlex.join([sys.executable, str(ROOT / "tests" / "fake_trial.py")])


def _server_binaries() -> list[str | None]:
    """initdb and pg_ctl: on PATH, or where Debian's packages keep them (``pg_config --bindir``, not on PATH)."""
    bindir = None
    if shutil.which("pg_config"):
        bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip() or None
    return [shutil.which(n) or shutil.which(n, path=bindir) for n in ("initdb", "pg_ctl")]


BIN = _server_binaries()
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(None in BIN, reason="PostgreSQL's initdb and pg_ctl not found (apt-get install postgresql)"),
]


@pytest.fixture(scope="module")
def postgres_url():
    """A throw-away server on a Unix socket (no TCP). PostgreSQL refuses to run as root: then as user postgres."""
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    home = Path(tempfile.mkdtemp(prefix="msar-pg-"))
    if as_user:
        shutil.chown(home, "postgres")
    data, log = home / "data", home / "server.log"
    with socket.socket() as s:  # the port only names the socket file; a free TCP port keeps it unique
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    initdb, pg_ctl = BIN
    subprocess.run(
        [*as_user, initdb, "-D", str(data), "-U", "postgres", "--auth=trust"], check=True, capture_output=True
    )
    subprocess.run(
        [
            *as_user,
            pg_ctl,
            "-D",
            str(data),
            "-l",
            str(log),
            "-w",
            "start",
            "-o",
            f"-k {home} -p {port} -c listen_addresses=''",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@/postgres?host={home}&port={port}"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def test_two_agents_share_one_study(tmp_path, postgres_url):
    space = tmp_path / "shared.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "shared",
                "trial_command": "other",
                "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
                "fixed": {"training.seq_len": 64, "fake.sleep": 0.3},
                "params": {
                    "training.micro_batch_size": {"type": "choice", "values": [1, 2, 4, 8, 16, 32, 64]},
                    "optim.lr": {"type": "choice", "values": [0.001, 0.002]},
                },
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}

    def agent(seed: int, trials_dir: Path) -> subprocess.Popen:  # each "machine" keeps its own trial dirs
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autoresearch.agent",
                "--space",
                str(space),
                "--storage",
                postgres_url,
                "--trials-dir",
                str(trials_dir),
                "--command",
                FAKE,
                "--estimator",
                "none",
                "--trials",
                "8",
                "--seed",
                str(seed),
                "--confirm",
                "0",
            ],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    agents = [agent(seed, tmp_path / f"host{seed}") for seed in (1, 2)]
    for a in agents:
        out, _ = a.communicate(timeout=240)
        assert a.returncode == 0, out

    study = optuna.load_study(study_name="shared", storage=storage.storage_url(postgres_url))
    trials = study.trials
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # Each agent stops once the shared study holds 8 finished trials; both may have had one running then.
    assert 8 <= storage.finished_count(study) <= 9
    pids = {t.user_attrs["agent"]["pid"] for t in trials}
    assert pids == {a.pid for a in agents}, "both agents wrote into the one study"
    ran = [t for t in trials if t.user_attrs.get("status") == "ok"]
    assert all(Path(t.user_attrs["trial_dir"], "trial_summary.json").exists() for t in ran)
    # The report reads it by URL, like optuna.load_study does.
    df = report.study_table(storage.load_study(storage=postgres_url, study="shared"))
    assert sorted(df["number"]) == [t.number for t in trials]
