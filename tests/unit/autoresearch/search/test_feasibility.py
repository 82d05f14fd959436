"""The feasibility memory (repeats, OOM and NaN dominance) and the memory model."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from autoresearch.search.feasibility import GATE_OOM, FeasibilityMemory
from autoresearch.search.memory_model import MemoryModel
from autoresearch.space import ChoiceParam, FloatParam, IntParam, SearchSpace, load_space


def make_space() -> SearchSpace:
    params = {
        "parallel.dp_replicate": ChoiceParam(values=[1, 2]),  # unannotated: same layout
        "training.micro_batch_size": IntParam(low=1, high=16, memory="up"),
        "memory.recompute": ChoiceParam(values=["full", "selective", "none"], memory="up"),
        "memory.offload_ratio": FloatParam(low=0.0, high=1.0, memory="down"),  # more offload, less memory
        "optim.lr": FloatParam(low=1e-4, high=1e-1, log=True, memory="none", nan="up"),
        "optim.warmup_steps": IntParam(low=0, high=20, memory="none", nan="down"),
        "optim": ChoiceParam(values=["adamw", "muon"], memory="none"),  # nan unannotated
    }
    return SearchSpace(name="t", objective={"metric": "val_loss", "direction": "minimize"}, world_size=2, params=params)


BASE = {
    "parallel.dp_replicate": 1,
    "training.micro_batch_size": 8,
    "memory.recompute": "none",
    "memory.offload_ratio": 0.5,
    "optim.lr": 0.01,
    "optim.warmup_steps": 5,
    "optim": "adamw",
}


def with_(**changes) -> dict:
    return {**BASE, **{k.replace("__", "."): v for k, v in changes.items()}}


@pytest.fixture
def memory() -> FeasibilityMemory:
    return FeasibilityMemory(make_space())


# ---------------------------------------------------------------------------------------------- repeats


@pytest.mark.parametrize("status", ["error", "invalid", "oom", "compile_error", "nan", "timeout"])
def test_exact_repeat_of_a_failure_is_skipped_naming_the_status(memory, status):
    memory.record(BASE, status, trial=4)
    assert memory.check(dict(BASE)) == f"same params as trial 4, which ended {status}; not repeating a failure"


def test_exact_repeat_of_an_ok_trial_is_a_duplicate(memory):
    memory.record(BASE, "ok", {"val_loss": 2.0}, trial=1)
    assert memory.check(dict(BASE)) == "duplicate of trial 1 (ok); its result stands"
    assert memory.check(with_(optim__lr=0.02)) is None


def test_repeat_matches_floats_that_differ_only_in_rounding_noise(memory):
    memory.record(with_(optim__lr=0.003), "error")
    assert memory.check(with_(optim__lr=0.0030000000000000005)).startswith("same params as an earlier trial")
    assert memory.check(with_(optim__lr=0.0031)) is None


def test_unknown_status_is_refused_and_pruned_is_ignored(memory):
    with pytest.raises(ValueError, match="unknown trial status 'crashed'"):
        memory.record(BASE, "crashed")
    memory.record(BASE, "pruned")
    assert memory.outcomes == [] and memory.check(BASE) is None


# ---------------------------------------------------------------------------------------------- OOM dominance


def test_oom_dominates_more_memory_on_the_same_layout(memory):
    memory.record(BASE, "oom", trial=3)
    reason = memory.check(with_(training__micro_batch_size=12))
    assert reason == (
        "dominated by OOM in trial 3 at training.micro_batch_size=8, memory.recompute=none, "
        "memory.offload_ratio=0.5 (same parallel.dp_replicate): this proposal needs at least as much memory; "
        "to run, change one of: training.micro_batch_size < 8, memory.recompute in [full, selective], "
        "memory.offload_ratio > 0.5"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"training.micro_batch_size": 16},  # up: larger
        {"memory.offload_ratio": 0.25},  # down: smaller
        {"optim.lr": 0.1, "optim": "muon", "optim.warmup_steps": 0},  # memory: none -> ignored
        {"training.micro_batch_size": 9, "memory.offload_ratio": 0.0},
    ],
)
def test_oom_dominance_skips(memory, change):
    memory.record(BASE, "oom")
    assert memory.check({**BASE, **change}).startswith("dominated by OOM in an earlier trial")


@pytest.mark.parametrize(
    "change",
    [
        {"training.micro_batch_size": 4},  # up param moved down: may fit
        {"memory.offload_ratio": 0.75},  # down param moved up: may fit
        {"memory.recompute": "selective"},  # an earlier choice: less memory
        {"training.micro_batch_size": 16, "memory.recompute": "full"},  # one axis up, another down: unknown
        {"parallel.dp_replicate": 2, "training.micro_batch_size": 16},  # unannotated param differs: no claim
    ],
)
def test_oom_dominance_does_not_skip_what_it_cannot_prove(memory, change):
    memory.record(BASE, "oom")
    assert memory.check({**BASE, **change}) is None


def test_choice_order_is_the_order_of_values(memory):
    memory.record(with_(memory__recompute="selective"), "oom")
    assert memory.check(with_(memory__recompute="none")).startswith("dominated by OOM")
    assert memory.check(with_(memory__recompute="full")) is None


def test_oom_at_the_edge_leaves_no_escape_on_that_axis(memory):
    memory.record(with_(training__micro_batch_size=1, memory__recompute="full", memory__offload_ratio=1.0), "oom")
    reason = memory.check(with_(training__micro_batch_size=2, memory__recompute="full", memory__offload_ratio=1.0))
    assert reason.endswith("needs at least as much memory; change one of parallel.dp_replicate to run")


def test_other_failures_do_not_dominate(memory):
    for status in ("error", "timeout", "compile_error", "invalid"):
        memory.record(BASE, status)
    assert memory.check(with_(training__micro_batch_size=16)) is None


# ---------------------------------------------------------------------------------------------- NaN dominance


def test_nan_dominates_higher_lr_with_same_optimizer(memory):
    memory.record(BASE, "nan", trial=7)
    reason = memory.check(with_(optim__lr=0.05, optim__warmup_steps=2))  # higher lr, less warmup
    assert reason == (
        "dominated by NaN in trial 7 at optim.lr=0.01, optim.warmup_steps=5 (same parallel.dp_replicate, "
        "training.micro_batch_size, memory.recompute, memory.offload_ratio, ...): this proposal is at least as "
        "likely to diverge; to run, change one of: optim.lr < 0.01, optim.warmup_steps > 5"
    )


@pytest.mark.parametrize(
    "change, skipped",
    [
        ({"optim.lr": 0.01}, True),  # at the same lr (different warmup below)
        ({"optim.lr": 0.02, "optim.warmup_steps": 0}, True),  # higher lr, less warmup
        ({"optim.lr": 0.005}, False),  # lower lr: may be stable
        ({"optim.lr": 0.02, "optim.warmup_steps": 10}, False),  # more warmup: may be stable
        ({"optim.lr": 0.05, "optim": "muon"}, False),  # another optimizer: unannotated, no claim
    ],
)
def test_nan_dominance_both_directions(memory, change, skipped):
    memory.record(BASE, "nan")
    proposal = {**BASE, "optim.warmup_steps": 4, **change}
    assert (memory.check(proposal) is not None) == skipped


@pytest.mark.parametrize(
    "first, final, skipped",
    [
        (5.5, 38.0, True),  # the loss blew up (lr 1.0 on the tiny model): evidence like a NaN
        (5.5, 5.5 * 1.5 + 0.01, True),
        (5.5, 5.5 * 1.5, False),  # at the ratio: not yet
        (5.5, 5.6, False),  # an lr too small to move the loss, plus noise: no claim
        (5.5, 3.2, False),  # it learned
        (None, 38.0, False),  # a summary without the first loss proves nothing
    ],
)
def test_a_diverged_loss_dominates_like_a_nan(memory, first, final, skipped):
    memory.record(BASE, "ok", {"first_loss": first, "final_loss": final}, trial=3)
    reason = memory.check(with_(optim__lr=0.05))
    assert (reason is not None) == skipped
    if skipped:
        assert reason.startswith(f"dominated by divergence (loss 5.5 -> {final:.4g}) in trial 3 at optim.lr=0.01")
        kind, _ = memory.verdict(with_(optim__lr=0.05))
        assert kind == "nan"
    assert memory.check(with_(optim__lr=0.005)) is None  # a lower lr is never dominated
    assert memory.check(with_(optim__lr=0.05, optim="muon")) is None  # nor another optimizer (unannotated)


def test_nan_does_not_imply_oom_or_vice_versa(memory):
    memory.record(BASE, "nan")
    assert memory.check(with_(training__micro_batch_size=16, optim__lr=0.005)) is None
    memory.record(with_(optim__warmup_steps=6), "oom")
    assert memory.check(with_(optim__lr=0.005, optim__warmup_steps=6)).startswith("dominated by OOM")


def test_on_the_shipped_spaces():
    par = FeasibilityMemory(load_space("parallel"))
    oom = {
        "parallel.dp_replicate": 1,
        "parallel.dp_shard": 1,
        "parallel.dp_shard_strategy": "optim_grads_params",
        "parallel.tp": 2,
        "parallel.sp": True,
        "parallel.cp": 1,
        "parallel.pp": 1,
        "parallel.pp_schedule": "1f1b",
        "parallel.pp_virtual": 1,
        "parallel.pp_offset": 0,
        "parallel.pp_transpose_layers": 0,
        "parallel.pp_transpose_overflow": "full",
        "training.micro_batch_size": 4,
        "memory.recompute": "full",
        "memory.swap": False,
        "training.mode": "jit",
    }
    par.record(oom, "oom", trial=0)
    assert par.check({**oom, "training.micro_batch_size": 8}).startswith(
        "dominated by OOM in trial 0 at training.micro_batch_size=4, memory.recompute=full, memory.swap=false (same "
        "parallel.dp_replicate, "
        "parallel.dp_shard, parallel.dp_shard_strategy, parallel.tp, ...): this proposal needs at least as much memory; to run, "
        "change one of: training.micro_batch_size in [1, 2]"
    )
    # full recompute keeps the least (measured: the annotation test below): an OOM with it dominates none and
    # selective; an OOM without it says nothing about full recompute, nor about the other mode
    assert par.check({**oom, "memory.recompute": "none"}).startswith(
        "dominated by OOM in trial 0 at training.micro_batch_size=4, memory.recompute=full"
    )
    par.record({**oom, "memory.recompute": "none", "training.mode": "pynative"}, "oom", trial=1)
    assert par.check({**oom, "training.mode": "pynative"}) is None
    assert par.check({**oom, "training.mode": "pynative", "training.micro_batch_size": 8}) is None
    assert par.check({**oom, "training.micro_batch_size": 2}) is None
    # neither do the degrees (a second rank's collective runtime outweighs what sharding saves here): another
    # layout is never dominated
    for other in ({"parallel.sp": False}, {"parallel.tp": 1, "parallel.sp": False, "parallel.dp_shard": 2}):
        assert par.check({**oom, **other, "training.micro_batch_size": 8}) is None

    hp = FeasibilityMemory(load_space("hparams"))
    nan = {
        "optim.lr": 0.02,
        "optim.warmup_steps": 5,
        "optim.weight_decay": 0.1,
        "optim": "adamw",
        "training.global_batch_size": 8,
    }
    hp.record(nan, "nan", trial=2)
    assert hp.check({**nan, "optim.lr": 0.03, "optim.weight_decay": 0.0}).startswith(
        "dominated by NaN in trial 2 at optim.lr=0.02, optim.warmup_steps=5 (same optim, training.global_batch_size)"
    )
    assert hp.check({**nan, "optim.lr": 0.03, "training.global_batch_size": 16}) is None
    assert hp.check({**nan, "optim.lr": 0.03, "optim": "muon"}) is None


# ---------------------------------------------------------------------------------------------- memory model


def test_memory_model_identity_ratio_and_least_squares():
    model = MemoryModel()
    assert model.predict(1000.0) == 1000.0 and model.coefficients() == (1.0, 0.0)
    model.add(1000.0, 1500.0)
    assert model.predict(2000.0) == 3000.0  # one point: the ratio
    model.add(2000.0, 2500.0)
    a, b = model.coefficients()  # two points: the line through them
    assert (a, b) == pytest.approx((1.0, 500.0))
    model.add(3000.0, 3600.0)  # three: least squares
    a, b = model.coefficients()
    assert (a, b) == pytest.approx((1.05, 433.333333), rel=1e-6)
    assert model.predict(4000.0) == pytest.approx(1.05 * 4000 + 433.333333, rel=1e-6)


def test_memory_model_falls_back_to_the_ratio_when_the_fit_is_meaningless():
    same_estimate = MemoryModel([(1000.0, 1200.0), (1000.0, 1400.0)])
    assert same_estimate.coefficients() == (1.3, 0.0)
    falling = MemoryModel([(1000.0, 3000.0), (2000.0, 1000.0)])  # negative slope: not a memory law
    assert falling.coefficients() == (4000.0 / 3000.0, 0.0)
    assert MemoryModel([(1000.0, 100.0), (2000.0, 1500.0)]).predict(10.0) == 0.0  # never negative


def test_memory_model_rejects_bad_points():
    with pytest.raises(ValueError, match="positive finite"):
        MemoryModel().add(0, 100)
    with pytest.raises(ValueError, match="positive finite"):
        MemoryModel().add(100, float("nan"))


def test_record_feeds_measured_peaks_but_not_oom_cutoffs(memory):
    memory.record(with_(optim__lr=0.001), "ok", {"estimated_memory_bytes": 1e9, "peak_memory_bytes": 1.5e9})
    memory.record(with_(optim__lr=0.002), "oom", {"estimated_memory_bytes": 2e9, "peak_memory_bytes": 1.6e9})
    memory.record(with_(optim__lr=0.003), "ok", {"estimated_memory_bytes": None, "peak_memory_bytes": 1e9})
    memory.record(with_(optim__lr=0.004), "nan", {"estimated_memory_bytes": 2e9, "peak_memory_bytes": 2.5e9})
    assert memory.memory_model.points == [(1e9, 1.5e9), (2e9, 2.5e9)]
    assert memory.memory_model.predict(3e9) == pytest.approx(3.5e9)


def test_a_trial_that_loaded_its_graphs_does_not_recalibrate_the_memory_model(memory):
    memory.record(
        with_(optim__lr=0.001),
        "ok",
        {"estimated_memory_bytes": 1e9, "peak_memory_bytes": 1.5e9, "compile_cache": "compiled"},
    )
    memory.record(
        with_(optim__lr=0.002),
        "ok",
        {"estimated_memory_bytes": 1e9, "peak_memory_bytes": 1.2e9, "compile_cache": "loaded"},
    )  # no compiler in its peak
    assert memory.memory_model.points == [(1e9, 1.5e9)]
    assert len(memory.outcomes) == 2


def test_memory_gate_uses_the_calibrated_prediction(memory):
    memory.record(with_(optim__lr=0.001), "ok", {"estimated_memory_bytes": 1e9, "peak_memory_bytes": 2e9})
    proposal = with_(optim__lr=0.002)
    assert memory.check(proposal, estimated_bytes=1e9, limit_bytes=3e9) is None
    reason = memory.check(proposal, estimated_bytes=2e9, limit_bytes=3e9)
    assert reason.startswith("predicted peak memory 3.73 GiB exceeds the limit 2.79 GiB, P(OOM) 0.76 (peak ≈ 2 × est")
    assert memory.check(proposal, estimated_bytes=2e9) is None  # no limit: no gate
    # The line is P(OOM) = sf(ln(limit / predicted) / sigma) at GATE_OOM: a percent either side of the budget
    sigma = memory.memory_model.log_error()
    for est, skipped in ((1.5e9 * 0.99, False), (1.5e9 * 1.01, True)):
        p = 0.5 * math.erfc(math.log(3e9 / (2 * est)) / sigma / math.sqrt(2))
        assert (p > GATE_OOM) is skipped and (
            memory.check(proposal, estimated_bytes=est, limit_bytes=3e9) is not None
        ) is skipped


def test_counts_and_describe(memory):
    memory.record(BASE, "oom")
    memory.record(with_(optim__lr=0.02), "ok")
    assert memory.counts() == {"oom": 1, "ok": 1}
    assert memory.describe() == "outcomes: oom 1, ok 1\nmemory model: uncalibrated (using the analytic estimate as is)"


def test_verdict_names_the_failure_kind_it_predicts(memory):
    memory.record(BASE, "oom", trial=3)
    assert memory.verdict(with_(training__micro_batch_size=12))[0] == "oom"
    assert memory.verdict(BASE)[0] == "oom"  # the very same params: its own status
    memory.record(with_(training__micro_batch_size=2), "ok")
    assert memory.verdict(with_(training__micro_batch_size=2)) == (
        None,
        "duplicate of an earlier trial (ok); its result stands",
    )
    assert memory.verdict(with_(training__micro_batch_size=4)) is None


def test_the_core_estimate_gates_an_oom_before_any_trial_ran():
    """benchmarks/spaces/tabular.yaml under its 0.875 GiB budget: measured, batch 32 goes out of memory (954 MiB
    with AdamW, 993 with Muon) and batch 16 fits (781 / 825 MiB). With nothing measured yet, the memory gate must
    already skip the first and run the second."""
    from autoresearch.core_adapter import estimate_with_core

    space = load_space(str(Path(__file__).resolve().parents[4] / "benchmarks" / "spaces" / "tabular.yaml"))
    memory = FeasibilityMemory(space)
    limit = space.fixed["memory.limit_gb"] * 2**30
    for opt in ("adamw", "muon"):

        def verdict(batch, opt=opt):
            params = {"optim.lr": 0.01, "training.global_batch_size": batch, "optim": opt}
            return memory.verdict(params, estimate_with_core(space.overrides(params)), limit)

        kind, reason = verdict(32)
        assert kind == "oom" and reason.startswith("predicted peak memory") and "uncalibrated" in reason
        assert verdict(16) is None and verdict(8) is None


# ------------------------------------------------------------------------------- annotations against measurement
@functools.lru_cache(maxsize=1)
def _measured_runs():
    """(config without the param under test, mode, peak) of every run of the memory sweep
    (benchmarks/data/memory_cpu.json), flattened to dotted keys; the global batch only as its accumulation steps."""
    import json

    from core.config import load_config, to_dict

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    data = Path(__file__).resolve().parents[4] / "benchmarks" / "data" / "memory_cpu.json"
    runs = []
    for row in json.loads(data.read_text())["rows"]:
        cfg = load_config(row["overrides"])
        config = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in flat(to_dict(cfg))
            if not k.startswith("trial.") and k != "training.global_batch_size"
        }
        runs.append(({**config, "accumulation": cfg.grad_accum_steps}, row["peak_bytes"], row["name"]))
    return runs


@pytest.mark.parametrize("space_name", ["parallel", "hparams", "moe"])
def test_memory_annotations_hold_on_every_measured_pair(space_name):
    """A shipped space may claim a memory direction (which dominance acts on, skipping trials) only where the
    measurement shows it: every pair of measured runs that differ in that param alone is ordered that way (within
    2%, the run-to-run noise of a peak), in each execution mode the space runs, with at least one pair per mode."""
    space = load_space(space_name)
    runs, grid = _measured_runs(), space.grid()
    for name, param in space.params.items():
        if param.memory not in ("up", "down"):
            continue
        numeric = param.type != "choice" or all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in param.values
        )

        def position(value, numeric=numeric, param=param):
            return float(value) if numeric else float(param.index(value))

        pairs: dict = {}
        for a, peak_a, name_a in runs:
            for b, peak_b, name_b in runs:
                if a[name] == b[name] or any(a[k] != b[k] for k in a if k != name):
                    continue
                if position(a[name]) < 0 or position(b[name]) < 0 or position(a[name]) > position(b[name]):
                    continue
                larger, smaller = (peak_b, peak_a) if param.memory == "up" else (peak_a, peak_b)
                assert smaller <= 1.02 * larger, (
                    f"{space_name}: {name}: {param.memory} is contradicted by "
                    f"{name_a} ({peak_a >> 20} MiB) vs {name_b} ({peak_b >> 20} MiB)"
                )
                pairs.setdefault(a["training.mode"], []).append((name_a, name_b))
        # the modes in which the space lets this param take two values (SWAP: PyNative only)
        values: dict = {}
        for point in grid:
            rest = tuple((k, str(v)) for k, v in point.items() if k != name)
            values.setdefault(rest, set()).add(str(point[name]))
        modes = {
            dict(rest).get("training.mode", space.fixed.get("training.mode", "jit"))
            for rest, seen in values.items()
            if len(seen) > 1
        }
        assert modes, f"{space_name}: {name} never varies alone"
        for mode in modes:
            assert pairs.get(mode), f"{space_name}: {name}: {param.memory} has no measured pair in {mode}"
