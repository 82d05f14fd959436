"""The trial contract's pure parts: failure classification, statuses, the summary schema, the watchdog."""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from core.trial import SCHEMA, STATUS, Exit, NonFinite, OutOfMemory, TrialRecorder, classify, write_invalid_summary
from tests.schema import assert_summary_schema


@pytest.mark.parametrize(
    "exc, code",
    [
        (RuntimeError("Allocate memory failed, size: 1073741824"), Exit.OOM),
        (RuntimeError("std::bad_alloc"), Exit.OOM),
        (RuntimeError("Device(id:0) memory isn't enough and alloc failed, Out of Memory!"), Exit.OOM),
        (RuntimeError("Malloc for kernel output failed, size: 4096"), Exit.OOM),
        (MemoryError(), Exit.OOM),
        (RuntimeError("Kernel AdamW is unregistered on CPU"), Exit.COMPILE_ERROR),
        (TypeError("Unsupported data type BFloat16 for MatMul: select kernel failed"), Exit.COMPILE_ERROR),
        (RuntimeError("Failed to compile graph 'construct'"), Exit.COMPILE_ERROR),
        (
            RuntimeError("lineno is out of bounds\n (See file rank_0/om/analyze_fail.ir for more details."),
            Exit.COMPILE_ERROR,
        ),
        (ValueError("something else entirely"), Exit.ERROR),
        (NonFinite("nan: loss nan at step 3"), Exit.NAN),
        (OutOfMemory("out of memory: rank RSS"), Exit.OOM),
    ],
)
def test_classify(exc, code):
    got, reason = classify(exc)
    assert got == code
    assert reason and "\n" not in reason


def _raised_in(filename: str, function: str) -> BaseException:
    """RuntimeError("Response is empty.") raised from ``function`` defined in a file named ``filename``."""
    scope: dict = {}
    exec(compile(f"def {function}():\n    raise RuntimeError('Response is empty.')\n", filename, "exec"), scope)
    try:
        scope[function]()
    except RuntimeError as exc:
        return exc
    raise AssertionError("not raised")


def test_compile_errors_are_known_by_where_they_are_raised():
    """MindSpore's graph compile call fails in many words (graph-kernel fusion's: "Response is empty."): the
    frame it came from decides, so the same words from elsewhere stay an ordinary error."""
    code, reason = classify(_raised_in("/site-packages/mindspore/graph/api.py", "compile"))
    assert code == Exit.COMPILE_ERROR and "Response is empty" in reason
    assert classify(_raised_in("/site-packages/mindspore/graph/api.py", "run"))[0] == Exit.ERROR
    assert classify(_raised_in("/work/core/api.py", "compile"))[0] == Exit.ERROR


def test_every_code_has_a_status():
    assert {STATUS[c] for c in Exit} == {"ok", "error", "invalid", "oom", "compile_error", "nan", "timeout"}


def test_summary_schema_and_metrics(tmp_path):
    rec = TrialRecorder(
        trial_dir=tmp_path,
        config={"trial": {"max_steps": 3}, "seed": 1, "parallel": {"dp_replicate": 1}},
        overrides=["seed=1"],
        started=time.time() - 2,
    )
    rec.flops_per_token, rec.reference_flops_per_sec = 1e6, 1e11
    for loss, dt in [(5.0, 3.0), (4.0, 0.1), (3.5, 0.3)]:  # the first step carries compilation
        rec.record_step(loss, 1.0, tokens=100, seconds=dt)
    s = rec.finish(Exit.OK, "ok")
    assert_summary_schema(s)
    assert json.loads((tmp_path / "trial_summary.json").read_text()) == json.loads(json.dumps(s))
    m = s["metrics"]
    assert m["step_time_ms_median"] == pytest.approx(200.0)  # median of the steps after the first
    assert m["tokens_per_sec"] == pytest.approx(100 / 0.2)
    assert m["mfu"] == pytest.approx(500 * 1e6 / 1e11)
    assert (m["first_loss"], m["final_loss"], m["min_loss"], s["steps"], s["tokens"]) == (5.0, 3.5, 3.5, 3, 300)
    assert m["val_loss"] is None  # not reached: null, never invented
    assert s["schema"] == SCHEMA and s["error"] is None


def test_failure_summary_names_rank_and_keeps_progress(tmp_path):
    rec = TrialRecorder(trial_dir=tmp_path, config={}, overrides=[], started=time.time(), rank=1, world_size=2)
    rec.record_step(float("nan"), float("inf"), tokens=10, seconds=0.1)
    s = rec.finish(Exit.NAN, "nan: loss nan at step 1", NonFinite("nan"))
    assert (tmp_path / "ranks" / "rank_1.json").exists()
    assert s["status"] == "nan" and s["error"]["rank"] == 1
    assert s["metrics"]["final_loss"] is None and s["metrics"]["grad_norm_last"] is None  # non-finite -> null


def test_invalid_summary(tmp_path):
    s = write_invalid_summary(tmp_path, ["x=1"], "invalid config: x: unknown", "x")
    assert_summary_schema(s)
    assert s["status"] == "invalid" and s["exit_code"] == 2 and s["error"]["field"] == "x"


def test_watchdog_ends_the_process_with_oom_and_a_summary(tmp_path):
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from core.trial import TrialRecorder, Watchdog
        rec = TrialRecorder(trial_dir=Path({str(tmp_path)!r}), config={{}}, overrides=[], started=time.time())
        Watchdog(lambda code, reason: rec.finish(code, reason), limit_bytes=300 * 2**20).start()
        hog = []
        while True:
            hog.append(bytearray(8 * 2**20))   # touched pages: RSS grows by 8 MiB per iteration
            time.sleep(0.005)
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == 10
    s = json.loads((tmp_path / "trial_summary.json").read_text())
    assert s["status"] == "oom" and "memory.limit_gb" in s["reason"]
    assert s["metrics"]["peak_memory_bytes"] >= 300 * 2**20


def test_watchdog_kills_a_hung_run_after_its_deadline(tmp_path):
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from core.trial import TrialRecorder, Watchdog
        rec = TrialRecorder(trial_dir=Path({str(tmp_path)!r}), config={{}}, overrides=[], started=time.time())
        Watchdog(lambda code, reason: rec.finish(code, reason), hard_deadline=time.time() + 1).start()
        time.sleep(60)   # a hung step
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=30)
    assert proc.returncode == 13
    assert json.loads((tmp_path / "trial_summary.json").read_text())["status"] == "timeout"
