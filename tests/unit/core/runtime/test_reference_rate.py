"""MFU's fixed denominator (core.reference_rate): measured once per machine, then read back."""

import json
import os

import numpy as np
import pytest

from core.runtime import reference_rate


def test_measured_once_then_read_back(tmp_path, monkeypatch):
    """The first call measures in a child process (the best of MindSpore's and NumPy's matmul rates) and caches
    it under this machine's key; the next call reads it without measuring again."""
    monkeypatch.setenv("MSAR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(reference_rate, "SIZE", 256)  # the child measures the size it is given: quick
    rate = reference_rate.reference_flops_per_sec("CPU")
    entries = json.loads((tmp_path / "reference_rate.json").read_text())
    entry = entries[reference_rate.machine_key("CPU")]
    assert set(entry["rates"]) == {"mindspore", "numpy"}
    assert rate == entry["flops_per_sec"] == max(entry["rates"].values())
    # a plausible fp32 matmul rate for a CPU: above 1 GFLOP/s, below 100 TFLOP/s
    assert all(1e9 < r < 1e14 for r in entry["rates"].values())

    entry["flops_per_sec"] = 12345.0  # the cache is what later trials read: no second measurement
    (tmp_path / "reference_rate.json").write_text(json.dumps(entries))
    assert reference_rate.reference_flops_per_sec("CPU") == 12345.0
    assert reference_rate.reference_flops_per_sec("CPU", force=True) != 12345.0


def test_rate_is_the_matmul_flops_over_the_fastest_run(monkeypatch):
    """2 n^3 FLOPs over the fastest of the timed runs (warm-up runs excluded): load only slows a run."""
    # perf_counter pairs: the runs take 0.5, 0.25 and 1.0 s, with 0.1 s between runs
    clock = iter(np.cumsum([0.0, 0.5, 0.1, 0.25, 0.1, 1.0]))
    monkeypatch.setattr(reference_rate, "WARMUP", 2)
    monkeypatch.setattr(reference_rate, "REPEATS", 3)
    monkeypatch.setattr(reference_rate.time, "perf_counter", lambda: next(clock))
    calls = []
    assert reference_rate._best_rate(calls.append, "a", 64) == pytest.approx(2 * 64**3 / 0.25)
    assert len(calls) == 5


def test_mindspore_is_measured_as_a_trial_runs_it(monkeypatch):
    """The MindSpore child sets the host-queue default a trial on this device gets (core.runtime.settings) before its
    first op: with MindSpore's spinning queues its matmul read 60 GFLOP/s instead of ~120."""
    from unittest import mock

    import mindspore

    from core.runtime import settings as execution

    seen = []
    monkeypatch.setattr(reference_rate.os, "sched_setaffinity", lambda pid, cores: None)
    monkeypatch.setattr(mindspore, "set_device", lambda device: None)  # refused once this process ran an op
    monkeypatch.setattr(
        reference_rate,
        "_best_rate",
        lambda matmul, a, size: seen.append(os.environ.get(execution.HOST_BLOCKING_ENV)) or 1.0,
    )
    with mock.patch.dict(os.environ, {execution.HOST_BLOCKING_ENV: "0"}):
        assert reference_rate.measure("mindspore", "CPU", size=8) == 1.0
    assert seen == ["1"]


def test_numpy_is_measured_on_every_core_even_from_a_trial(monkeypatch):
    """A trial runs with OMP_NUM_THREADS=1 (core.runtime.native_env), which NumPy's OpenBLAS would obey: the child that
    measures the reference does not inherit it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    real_run, seen = reference_rate.subprocess.run, []

    def run(args, **kwargs):
        seen.append(kwargs.get("env"))
        return real_run(args, **kwargs)

    monkeypatch.setattr(reference_rate.subprocess, "run", run)
    monkeypatch.setattr(reference_rate, "SIZE", 128)
    assert reference_rate._measure_in_child("numpy", "CPU") > 1e8
    assert seen and seen[0] is not None and "OMP_NUM_THREADS" not in seen[0]
