"""cpu-local's calibration: the fits recover the numbers that generated their measurements (the trials' and the
all-reduce micro-benchmark's), the profile reads this machine's cached entry, or says to calibrate, naming the key,
and ranks that outnumber the host's cores share its launches and collectives."""

import json

import pytest

from core.config import ConfigError, load_config
from core.perf import calibrate, collectives, device, links
from core.perf.calibrate import ALONE, BASE, LAYOUTS, PREDICTED, START, TOGETHER, fit
from core.perf.device import Link
from core.perf.step import estimate_step, planned_config
from core.runtime.cache_dirs import CACHE_ENV
from core.runtime.reference_rate import machine_key

PEAK = {"peak_tflops_fp32": 0.1, "memory_bandwidth_gbps": 20.0}  # a made-up host; no reference rate needed


LINK = {"host_cores": 1.0, "intra_node_bandwidth_gbps": 0.6}  # measured before the fit (host_cores, measure_link)
FITTED = {"matmul_efficiency": 0.55, "launch_overhead_us": 1500.0, "pynative_overhead_us": 9000.0}
FITTED |= {"intra_node_latency_us": 3000.0}


def calibration_steps(truth: dict) -> dict[str, float]:
    """The step core.perf predicts for each calibration layout it predicts, through the profile ``truth``; the
    side-by-side pair at one rank per core."""
    sets = [f"cluster.{k}={v}" for k, v in truth.items()]
    steps = {name: estimate_step(planned_config([*BASE, *LAYOUTS[name], *sets])).step_time_sec for name in PREDICTED}
    return steps | {ALONE: 0.1, TOGETHER: 0.1 * calibrate.copies(TOGETHER) / truth["host_cores"]}


def test_the_fit_recovers_the_numbers_behind_the_measurements():
    measured = calibration_steps({**PEAK, **LINK, **FITTED})
    assert calibrate.host_cores(measured) == pytest.approx(LINK["host_cores"])
    fitted = fit(measured, {**PEAK, **LINK, **START})
    for key, value in FITTED.items():
        assert fitted[key] == pytest.approx(value, rel=1e-3), key


def test_a_layout_the_model_cannot_reach_does_not_pull_the_others():
    """A tp=2 trial faster than its prediction with no latency at all (as on a host with two real cores): its
    number stops at 0 and the layout is set aside; the others keep the numbers that generated them, where a joint
    least-squares fit would have moved the efficiency off the 1-process trial (as CI's machine saw: 10% off)."""
    no_latency = calibration_steps({**PEAK, **LINK, **FITTED, "intra_node_latency_us": 0.0})
    measured = calibration_steps({**PEAK, **LINK, **FITTED}) | {"tp=2": 0.8 * no_latency["tp=2"]}
    fitted = fit(measured, {**PEAK, **LINK, **START})
    assert fitted["intra_node_latency_us"] == 0.0
    for key in ("matmul_efficiency", "launch_overhead_us", "pynative_overhead_us"):
        assert fitted[key] == pytest.approx(FITTED[key], rel=1e-3), key
    missed = calibrate.not_reproduced(measured, fitted)
    assert list(missed) == ["tp=2"] and "intra_node_latency_us stopped at its bound 0" in missed["tp=2"]


@pytest.mark.parametrize("n", [2, 4])
def test_the_ring_fit_recovers_the_link_behind_all_reduce_times(n):
    """Times of the ring formula (core.perf.links) at the micro-benchmark's sizes give back its latency and
    bandwidth; a mere line through them would not (2(n-1) steps of latency, 2(n-1)/n of the bytes)."""
    link = Link(0.25e9, 180e-6)
    times = {b: links.all_reduce(b, n, link) for b in collectives.SIZES}
    latency, bandwidth = collectives.ring_fit(times, n)
    assert latency == pytest.approx(180e-6, rel=1e-6) and bandwidth == pytest.approx(0.25e9, rel=1e-6)


def test_ranks_that_outnumber_the_cores_share_their_launches_and_links(tmp_path, monkeypatch):
    """Four ranks on two cores: each rank's launches and PyNative dispatch take twice as long, its collectives
    reach half the bandwidth and wait twice as long per step for their peers; two ranks on two cores, or a profile
    without host_cores, as is."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # no calibration of this machine to take host_cores from
    base = ["cluster.peak_tflops_fp32=0.1", "cluster.memory_bandwidth_gbps=20", "cluster.matmul_efficiency=0.5"]
    base += ["cluster.launch_overhead_us=100", "cluster.pynative_overhead_us=1000"]
    base += ["cluster.intra_node_bandwidth_gbps=0.3", "cluster.intra_node_latency_us=200"]

    def rates(*overrides):
        return device.device(load_config([*base, *overrides]).cluster, "fp32")

    alone = rates()
    for shared, share in (
        (rates("cluster.devices_per_node=4", "cluster.host_cores=2"), 2),
        (rates("cluster.devices_per_node=2", "cluster.host_cores=2"), 1),
        (rates("cluster.devices_per_node=4"), 1),
    ):
        assert shared.launch == pytest.approx(alone.launch * share)
        assert shared.pynative == pytest.approx(alone.pynative * share)
        assert shared.intra.bandwidth == pytest.approx(alone.intra.bandwidth / share)
        assert shared.intra.latency == pytest.approx(alone.intra.latency * share)


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
    truth = {"memory_bandwidth_gbps": 20.0, **LINK, **FITTED}
    reference = tmp_path / "reference_rate.json"

    def cache(flops: float) -> None:
        reference.write_text(json.dumps({machine_key("CPU"): {"flops_per_sec": flops}}))

    cache(true_rate)
    measured = calibration_steps(truth)
    cache(rate)
    calls = []

    def measure_again(device, force=False, keep_higher=False):
        calls.append(force)
        if force:
            cache(max(rate, remeasured) if keep_higher else remeasured)

    monkeypatch.setattr(calibrate, "reference_flops_per_sec", measure_again)
    monkeypatch.setattr(calibrate.micro, "memory_bandwidth_gbps", lambda: truth["memory_bandwidth_gbps"])
    link = {"intra_node_bandwidth_gbps": LINK["intra_node_bandwidth_gbps"], "all_reduce": {"latency_us": 200.0}}
    monkeypatch.setattr(calibrate, "measure_link", lambda cores, rounds: dict(link))
    monkeypatch.setattr(calibrate, "measure_layouts", lambda layouts, base, rounds: measured)
    return calls


def test_a_reference_rate_measured_under_load_is_measured_again(tmp_path, monkeypatch):
    # The cached rate is a third of the machine's: the trial beats it at full efficiency, so it is measured again.
    calls = _machine(tmp_path, monkeypatch, rate=2e10, remeasured=6e10)
    entry = calibrate.calibrate(force=True)
    assert calls == [False, True]
    assert entry["matmul_efficiency"] == pytest.approx(0.55, rel=1e-3) and entry["not_reproduced"] == {}
    assert entry["host_cores"] == 1.0 and entry["all_reduce"] == {"latency_us": 200.0}
    assert entry["intra_node_latency_us"] == pytest.approx(3000.0, rel=1e-3)
    assert json.loads(device.calibration_path().read_text())[machine_key("CPU")] == entry


def test_a_fit_the_reference_rate_cannot_explain_is_not_cached(tmp_path, monkeypatch):
    calls = _machine(tmp_path, monkeypatch, rate=2e10, remeasured=1e10)  # loaded again: the higher rate stays
    with pytest.raises(SystemExit, match=r"matmul_efficiency stopped at its bound 1.*reference_rate --force"):
        calibrate.calibrate(force=True)
    assert calls == [False, True, True] and not device.calibration_path().exists()


def _ranks_exiting(monkeypatch, *runs: list[int]) -> list[int]:
    """collectives.measure over stand-in ranks: each call exits with the next run's codes (rank 0 prints one
    timing when its run succeeds); returns the list the calls are counted in."""
    calls = []

    def run_ranks(n, *args, log_dir, timeout):
        codes = runs[len(calls)]
        calls.append(codes)
        ok = f'{collectives.MARK}{{"4096": 0.5}}' if not any(codes) else "Fatal Python error: Segmentation fault"
        return [(code, ok if rank == 0 else "") for rank, code in enumerate(codes)]

    monkeypatch.setattr(collectives, "run_ranks", run_ranks)
    return calls


def test_a_rank_killed_by_a_signal_is_run_again_once(monkeypatch, capsys):
    calls = _ranks_exiting(monkeypatch, [-11, 0], [0, 0])
    assert collectives.measure(2) == {4096: 0.5} and len(calls) == 2
    assert "rank 0 of 2 exited -11 (signal 11), attempt 1 of 2; running it again" in capsys.readouterr().err


@pytest.mark.parametrize("runs", [([1, 0],), ([0, -6], [-11, 0])])
def test_a_rank_that_exits_with_a_code_or_dies_twice_fails_naming_it(monkeypatch, runs):
    """An exit code is the benchmark's own failure: not run again. The summary ends the message too."""
    calls = _ranks_exiting(monkeypatch, *runs)
    code = next(c for c in runs[-1] if c)
    with pytest.raises(SystemExit, match=rf"exited {code}\Z") as failed:
        collectives.measure(2)
    assert len(calls) == len(runs) and str(failed.value).startswith("collective micro-benchmark: rank")
