"""core.trial.fork_server: processes forked from a warm server behave as the ``python`` processes they stand in for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from core.trial import fork_server as warm

# What a child reports of itself: enough to compare it with a fresh interpreter's view.
PROBE = """
import json, os, sys
import mindspore.graph.api as api
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"),
                  "path0": sys.path[0], "extra": os.environ.get("PYTHONPATH", "") in sys.path,
                  "entry": api.entry_script_path,
                  "deps": api._get_compile_cache_dep_files() if os.path.isfile(api.entry_script_path) else None,
                  "affinity": sorted(os.sched_getaffinity(0)), "session": os.getsid(0) == os.getpid()}))
"""


@pytest.fixture(scope="module")
def server():
    with warm.serving(preload=("mindspore",)) as address:
        yield address


def probe(runner, tmp_path, name: str, *args: str, prefix: tuple = ()) -> tuple[int, dict]:
    out = tmp_path / f"{name}.out"
    env = {**os.environ, "PROBE_VALUE": name, "PYTHONPATH": str(tmp_path / "extra")}
    with open(out, "wb") as f:
        proc = runner(
            [*prefix, sys.executable, *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
        code = proc.wait(timeout=120)
    lines = out.read_text().strip().splitlines()
    return code, json.loads(lines[-1]) if code == 0 else {"output": lines}


def test_a_warm_child_is_the_process_it_stands_in_for(server, tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    for args in (("-c", PROBE, "a", "b"), ("-m", "probe_mod", "x")):
        cold_code, cold = probe(subprocess.Popen, tmp_path, "cold", *args)
        warm_code, warmed = probe(warm.popen, tmp_path, "warm", *args)
        assert cold_code == warm_code == 0, (cold, warmed)
        assert warmed.pop("env") == "warm" and cold.pop("env") == "cold"
        # argv, working directory, sys.path, and MindSpore's entry script and compile-cache dependencies as a
        # fresh interpreter has them (without core.trial.fork_server's workaround the entry script is core/trial/fork_server.py).
        assert warmed == cold
        assert warmed["session"] and warmed["extra"]


def test_exit_codes_signals_and_timeouts_are_popens(server, tmp_path):
    def run(code: str, timeout=60):
        proc = warm.popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert isinstance(proc, warm.WarmProcess) and proc.pid > 0
        return proc, proc.wait(timeout=timeout)

    assert run("import sys; sys.exit(12)")[1] == 12
    assert run("import os; os._exit(10)")[1] == 10
    assert run("raise ValueError('boom')")[1] == 1
    assert run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")[1] == -signal.SIGKILL
    slow = warm.popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.DEVNULL, start_new_session=True
    )
    with pytest.raises(subprocess.TimeoutExpired):
        slow.wait(timeout=0.3)
    assert slow.poll() is None
    os.killpg(slow.pid, signal.SIGTERM)  # its own session: the runner's watchdog ends it this way
    assert slow.wait(timeout=30) == -signal.SIGTERM


def test_taskset_becomes_the_childs_affinity(server, tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    code, seen = probe(warm.popen, tmp_path, "pinned", "-c", PROBE, prefix=("taskset", "-c", str(cores[-1])))
    assert code == 0, seen  # (the child's output: it failed once in CI under load, exit 1, its cause unseen)
    assert seen["affinity"] == [cores[-1]]


def test_without_a_server_or_for_other_commands_it_is_popen(tmp_path, monkeypatch):
    monkeypatch.delenv(warm.SOCKET_ENV, raising=False)
    proc = warm.popen([sys.executable, "-c", "pass"])
    assert isinstance(proc, subprocess.Popen) and proc.wait() == 0
    monkeypatch.setenv(warm.SOCKET_ENV, str(tmp_path / "no-server"))
    script = tmp_path / "script.py"
    script.write_text("pass\n")
    proc = warm.popen([sys.executable, str(script)])  # a script file, not -m / -c: a plain process
    assert isinstance(proc, subprocess.Popen) and proc.wait() == 0


def test_an_unreachable_server_starts_the_process_cold_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(warm.SOCKET_ENV, str(tmp_path / "gone"))  # a server that died, or never bound
    proc = warm.popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert isinstance(proc, subprocess.Popen) and proc.wait() == 3
    assert "no warm server at" in capsys.readouterr().err


def test_a_server_named_in_env_alone_forks_the_child(server, tmp_path, monkeypatch):
    """A caller that keeps the server out of its own environment (the integration tests' ``warm``) names it in the
    child's: warm then; an env without it, in a process without it, is cold."""
    monkeypatch.delenv(warm.SOCKET_ENV)  # the fixture's serving() set it
    env = dict(os.environ)
    proc = warm.popen([sys.executable, "-c", "pass"], env={**env, warm.SOCKET_ENV: server})
    assert isinstance(proc, warm.WarmProcess) and proc.wait(timeout=60) == 0
    proc = warm.popen([sys.executable, "-c", "pass"], env=env)
    assert isinstance(proc, subprocess.Popen) and proc.wait() == 0
