"""``python -m core.perf calibrate`` on this machine, for real: its trials and micro-benchmarks, the entry
cached, and ``python -m core.perf`` then predicting the 1-process trial it was fitted on at its measured step.

The machine's reference rate is given, above any CPU's peak: measured here it would be measured beside the other
tests' load, which the trials may not meet (then the calibration measures it again or refuses, as
tests/unit/core/perf/test_calibrate.py checks); the fit is of peak x efficiency, so any peak above the truth serves."""

import json
import os
import subprocess
import sys

import pytest

from core.perf import collectives
from core.perf.calibrate import BASE
from core.runtime.cache_dirs import CACHE_ENV
from core.runtime.reference_rate import machine_key

from .conftest import ROOT


def test_calibrate_caches_a_profile_that_reproduces_its_fit(tmp_path):
    env = {**os.environ, CACHE_ENV: str(tmp_path)}
    # 64 fp32 FLOP per cycle (two AVX-512 FMA units) at 5 GHz on every core: above what this host can reach
    peak = 64 * 5e9 * os.cpu_count()
    (tmp_path / "reference_rate.json").write_text(json.dumps({machine_key("CPU"): {"flops_per_sec": peak}}))
    done = subprocess.run(
        [sys.executable, "-m", "core.perf", "calibrate", "--rounds", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[:1000] + "\n...\n" + done.stderr[-2000:]
    (entry,) = json.loads((tmp_path / "perf_calibration.json").read_text()).values()
    for key in ("memory_bandwidth_gbps", "matmul_efficiency", "intra_node_bandwidth_gbps"):
        assert entry[key] > 0, key
    assert 0 < entry["matmul_efficiency"] <= 1 and entry["intra_node_latency_us"] >= 0
    assert entry["launch_overhead_us"] >= 0 and entry["pynative_overhead_us"] >= 0
    assert "1 process" not in entry["not_reproduced"]
    # measured, not fitted: the host's cores (at most those the calibration may use) and the all-reduce's timings
    assert 1 <= entry["host_cores"] <= len(os.sched_getaffinity(0))
    assert len(entry["all_reduce"]["seconds"]) == len(collectives.SIZES) and entry["all_reduce"]["latency_us"] > 0
    predicted = subprocess.run(
        [sys.executable, "-m", "core.perf", *BASE, "--json"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert predicted.returncode == 0, predicted.stderr
    step = json.loads(predicted.stdout)["step_time_sec"]
    assert step == pytest.approx(entry["measured_step_sec"]["1 process"], rel=1e-3)
