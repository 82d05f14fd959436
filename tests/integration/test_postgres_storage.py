"""--storage postgresql://: two agents (as on two machines) share one study in a real PostgreSQL server."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autoresearch.report import table as report
from autoresearch.study import storage
from autoresearch.study.connection import storage_url

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


class Server:
    """A throw-away PostgreSQL server on a Unix socket (no TCP), which a test may stop and start again."""

    def __init__(self):
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []  # PostgreSQL refuses root
        self.home = Path(tempfile.mkdtemp(prefix="msar-pg-"))
        if self.as_user:
            shutil.chown(self.home, "postgres")
        self.data, self.log = self.home / "data", self.home / "server.log"
        with socket.socket() as s:  # the port only names the socket file; a free TCP port keeps it unique
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        initdb, self.pg_ctl = BIN
        subprocess.run(
            [*self.as_user, initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust"],
            check=True,
            capture_output=True,
        )
        self.url = f"postgresql://postgres@/postgres?host={self.home}&port={self.port}"

    def start(self) -> None:
        options = f"-k {self.home} -p {self.port} -c listen_addresses=''"
        subprocess.run(
            [*self.as_user, self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "start", "-o", options],
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            [*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"], capture_output=True
        )


@pytest.fixture(scope="module")
def postgres():
    server = Server()
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(server.home, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_url(postgres):
    return postgres.url


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

    study = optuna.load_study(study_name="shared", storage=storage_url(postgres_url))
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


def test_a_storage_that_drops_mid_study_is_waited_for_and_nothing_is_lost(tmp_path, postgres):
    """The server stopped while the agent runs its third trial and started again seconds later: every call the
    agent made meanwhile (the running trial's heartbeat, telling it) waits and retries with backoff, the study goes
    on to the end, and every trial is recorded."""
    space = tmp_path / "dropped.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "dropped",
                "trial_command": "other",
                "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
                "fixed": {"training.seq_len": 64, "fake.sleep": 2.0},
                "params": {"training.micro_batch_size": {"type": "choice", "values": [1, 2, 4, 8, 16]}},
            }
        )
    )
    out = tmp_path / "agent.log"
    argv = [sys.executable, "-m", "autoresearch.agent", "--space", str(space), "--storage", postgres.url]
    argv += ["--trials-dir", str(tmp_path / "trials"), "--command", FAKE, "--estimator", "none"]
    argv += ["--proposer", "grid", "--trials", "5", "--confirm", "0", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    with open(out, "w") as log:
        agent = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while "trial    1 ok" not in out.read_text():  # two trials told: the third is running
            assert agent.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        postgres.stop("fast")  # every connection closed; nothing listens
        time.sleep(6)
        postgres.start()
        assert agent.wait(timeout=180) == 0, out.read_text()
    text = out.read_text()
    assert f"port={postgres.port} unreachable (" in text and "retrying in" in text, text
    study = optuna.load_study(study_name="dropped", storage=storage_url(postgres.url))
    assert storage.finished_count(study) == 5
    assert sorted(t.params["training.micro_batch_size"] for t in study.trials) == [1, 2, 4, 8, 16]
    assert all(t.user_attrs["status"] == "ok" and t.state == TrialState.COMPLETE for t in study.trials)
