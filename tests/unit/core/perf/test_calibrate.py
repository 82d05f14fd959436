"""cpu-local's calibration: the fit recovers the numbers that generated its measurements, and the profile reads
this machine's cached entry, or says to calibrate, naming the key."""

import json

import pytest

from core.config import ConfigError, load_config
from core.perf import calibrate, device
from core.perf.calibrate import BASE, LAYOUTS, fit
from core.perf.step import estimate_step, planned_config
from core.runtime.cache_dirs import CACHE_ENV
from core.runtime.reference_rate import machine_key

PEAK = {"peak_tflops_fp32": 0.1, "memory_bandwidth_gbps": 20.0}  # a made-up host; no reference rate needed


def test_the_fit_recovers_the_numbers_behind_the_measurements():
    truth = {**PEAK, "matmul_efficiency": 0.55, "intra_node_bandwidth_gbps": 0.3, "intra_node_latency_us": 800.0}
    truth |= {"launch_overhead_us": 1500.0, "pynative_overhead_us": 9000.0}
    measured = {
        name: estimate_step(
            planned_config([*BASE, *overrides, *(f"cluster.{k}={v}" for k, v in truth.items())])
        ).step_time_sec
        for name, overrides in LAYOUTS.items()
    }
    start = {**PEAK, "matmul_efficiency": 1.0, "intra_node_bandwidth_gbps": 1.0, "intra_node_latency_us": 0.0}
    fitted = fit(measured, {**start, "launch_overhead_us": 0.0, "pynative_overhead_us": 0.0})
    for key in (
        "matmul_efficiency",
        "intra_node_bandwidth_gbps",
        "intra_node_latency_us",
        "launch_overhead_us",
        "pynative_overhead_us",
    ):
        assert fitted[key] == pytest.approx(truth[key], rel=1e-3), key


def test_a_cpu_profile_reads_the_calibration_or_names_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cluster = load_config(["cluster.peak_tflops_fp32=0.1"]).cluster
    with pytest.raises(ConfigError) as info:
        device.device(cluster, "fp32")
    assert info.value.field.startswith("cluster.") and "core.perf calibrate" in str(info.value)
    entry = {"matmul_efficiency": 0.5, "memory_bandwidth_gbps": 12.0, "intra_node_bandwidth_gbps": 0.2}
    entry |= {"intra_node_latency_us": 100.0, "launch_overhead_us": 250.0}
    stale = {**entry, "method": device.CALIBRATION_METHOD - 1}  # fitted through an older model: not used
    device.calibration_path().write_text(json.dumps({machine_key("CPU"): stale}))
    assert calibrate.calibration() is None
    entry["method"] = device.CALIBRATION_METHOD
    device.calibration_path().write_text(json.dumps({machine_key("CPU"): entry}))
    rates = device.device(cluster, "fp32")
    assert rates.efficiency == 0.5 and rates.memory_bandwidth == 12e9 and rates.launch == pytest.approx(250e-6)
    assert rates.intra.bandwidth == pytest.approx(0.2e9) and rates.intra.latency == pytest.approx(100e-6)
    assert calibrate.calibration() == entry
    assert rates.pynative is None  # an entry without it: jit priced, pynative refused naming the key
    with pytest.raises(ConfigError, match="cluster.pynative_overhead_us"):
        estimate_step(planned_config(["cluster.peak_tflops_fp32=0.1", "training.mode=pynative"]))


def _machine(tmp_path, monkeypatch, rate: float, remeasured: float, true_rate: float = 6e10):
    """A machine whose cached reference rate is ``rate``, a second measurement finds ``remeasured``, and whose
    calibration trials ran as the model predicts at efficiency 0.55 of ``true_rate``; MindSpore never runs."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    truth = {"memory_bandwidth_gbps": 20.0, "matmul_efficiency": 0.55, "intra_node_bandwidth_gbps": 0.3}
    truth |= {"intra_node_latency_us": 800.0, "launch_overhead_us": 1500.0, "pynative_overhead_us": 9000.0}
    reference = tmp_path / "reference_rate.json"

    def cache(flops: float) -> None:
        reference.write_text(json.dumps({machine_key("CPU"): {"flops_per_sec": flops}}))

    cache(true_rate)
    measured = {
        name: estimate_step(planned_config([*BASE, *o, *(f"cluster.{k}={v}" for k, v in truth.items())])).step_time_sec
        for name, o in LAYOUTS.items()
    }
    cache(rate)
    calls = []

    def measure_again(device, force=False, keep_higher=False):
        calls.append(force)
        if force:
            cache(max(rate, remeasured) if keep_higher else remeasured)

    monkeypatch.setattr(calibrate, "reference_flops_per_sec", measure_again)
    monkeypatch.setattr(calibrate, "measure_bandwidth", lambda: truth["memory_bandwidth_gbps"])
    monkeypatch.setattr(calibrate, "measure_layouts", lambda layouts, base, rounds: measured)
    return calls


def test_a_reference_rate_measured_under_load_is_measured_again(tmp_path, monkeypatch):
    # The cached rate is a third of the machine's: the trial beats it at full efficiency, so it is measured again.
    calls = _machine(tmp_path, monkeypatch, rate=2e10, remeasured=6e10)
    entry = calibrate.calibrate(force=True)
    assert calls == [False, True]
    assert entry["matmul_efficiency"] == pytest.approx(0.55, rel=1e-3) and entry["not_reproduced"] == {}
    assert json.loads(device.calibration_path().read_text())[machine_key("CPU")] == entry


def test_a_fit_the_reference_rate_cannot_explain_is_not_cached(tmp_path, monkeypatch):
    calls = _machine(tmp_path, monkeypatch, rate=2e10, remeasured=1e10)  # loaded again: the higher rate stays
    with pytest.raises(SystemExit, match=r"matmul_efficiency stopped at its bound 1.*reference_rate --force"):
        calibrate.calibrate(force=True)
    assert calls == [False, True, True] and not device.calibration_path().exists()
