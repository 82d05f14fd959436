"""The supervisor's judgement without ranks: which rank hung, and what the trial's verdict is when one did (the
processes themselves: tests/integration/test_multi_node.py, test_trial_contract.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from core.trial import supervisor as sv
from core.trial.contract import Exit


class Running:
    pid, returncode = 4242, None

    def poll(self):
        return None


def test_a_rank_in_the_kernel_long_enough_hangs_a_stopped_one_at_once(monkeypatch):
    seen = iter([(0.0, "D"), (3.0, "D"), (6.0, "D"), (7.0, "S"), (8.0, "T")])
    now = {"t": 0.0}

    def state(pid):
        now["t"], letter = next(seen)
        return letter

    monkeypatch.setattr(sv, "_state", state)
    monkeypatch.setattr(sv, "_vm_hwm", lambda pid: None)
    monkeypatch.setattr(sv, "time", SimpleNamespace(time=lambda: now["t"]))
    rank = sv.Rank(1, Running())
    hung = []
    for _ in range(5):
        rank.poll()
        hung.append(rank.hung)
    assert hung[:2] == ["", ""]  # a read from disk is state D too: not yet a hang
    assert hung[2] == "stuck in the kernel (state D for 6 s)"
    assert hung[3] == ""  # it woke up
    assert hung[4] == "stopped (SIGSTOP or a tracer: state T)"


def _end(rank: int, code: int | None, *, hung: str = "", killed: bool = False, at: float = 1.0) -> dict:
    report = None if code is None else {"exit_code": code, "reason": f"rank {rank}: exit {code}"}
    return {
        "rank": rank,
        "node": 0,
        "exit_code": code,
        "ended_at": at,
        "killed_by_supervisor": killed,
        "hung": hung,
        "peak_memory_bytes": None,
        "report": report,
    }


def supervisor() -> sv.Supervisor:
    return sv.Supervisor(
        overrides=[], trial_dir=Path("."), world_size=2, started=0.0, wall_budget=None, grace=5.0, config={}
    )


def test_the_hung_rank_is_the_cause_not_its_peers_error():
    ends = [_end(0, 1), _end(1, None, hung="stopped (SIGSTOP or a tracer: state T)", killed=True)]
    code, reason, rank = supervisor()._verdict(ends)
    assert (code, rank) == (Exit.TIMEOUT, 1)
    assert reason == "timeout: rank 1 stopped (SIGSTOP or a tracer: state T) and its peers' collectives gave up"


def test_a_classified_failure_still_wins_over_a_hung_rank():
    ends = [_end(0, int(Exit.OOM)), _end(1, None, hung="stuck in the kernel (state D for 9 s)", killed=True)]
    code, _, rank = supervisor()._verdict(ends)
    assert (code, rank) == (Exit.OOM, 0)
