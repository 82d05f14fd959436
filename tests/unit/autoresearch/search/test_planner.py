"""The plan (``autoresearch.search.planner``, ``python -m autoresearch.plan``): every verdict true of its row,
predictions equal to ``core.perf``'s through the full Hydra path, an order that does not depend on the order of
the space file, pinned overrides, and exit 2 naming the key; the command runs with MindSpore absent."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from autoresearch.plan import main
from autoresearch.search.planner import Verdict, plan
from autoresearch.space import load_space
from core.config import ConfigError
from core.perf import estimate_step, fits_device, planned_config
from core.perf.least_recompute import least_recompute

ROOT = Path(__file__).resolve().parents[4]
SPACE = {
    "name": "plan-test",
    "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
    "world_size": 16,
    "fixed": {
        "model": "llama3-8b",
        "cluster": "h100-sxm",
        "cluster.nodes": 2,
        "device": "GPU",
        "training.precision": "bf16",
        "training.seq_len": 4096,
        "training.global_batch_size": 64,
    },
    "params": {
        "parallel.dp_shard": {"type": "choice", "values": [1, 2, 4, 8, 16]},
        "parallel.tp": {"type": "choice", "values": [1, 2, 4, 8]},
        "parallel.pp": {"type": "choice", "values": [1, 2]},
        "training.micro_batch_size": {"type": "choice", "values": [1, 4]},
        "memory.recompute": {"type": "choice", "values": ["none", "full"]},
    },
    "constraints": ["parallel.dp_shard * parallel.tp * parallel.pp == 16"],
}


def _write(tmp_path: Path, doc: dict, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def space_file(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("plan"), SPACE)


@pytest.fixture(scope="module")
def rows(space_file):
    return plan(load_space(space_file))


def _overrides(space: dict, params: dict) -> list[str]:
    settings = {**space["fixed"], **params}
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()]


def test_every_verdict_is_true_of_its_row(rows):
    verdicts = {r.verdict for r in rows}
    assert {Verdict.RANKED, Verdict.DOMINATED, Verdict.MEMORY} <= verdicts  # the space has each kind
    ranked = [r for r in rows if r.verdict is Verdict.RANKED]
    for row in rows:
        if row.verdict is Verdict.DOMINATED:  # some ranked point is at least as fast with no more memory
            assert any(
                o.tokens_per_sec_per_device >= row.tokens_per_sec_per_device and o.memory_gib <= row.memory_gib
                for o in ranked
            )
        elif row.verdict is Verdict.MEMORY:
            assert row.memory_gib > 80
    for a in ranked:  # no ranked point dominates another
        assert a.memory_gib <= 80
        assert not any(
            b is not a and b.tokens_per_sec_per_device >= a.tokens_per_sec_per_device and b.memory_gib <= a.memory_gib
            for b in ranked
        )
    speeds = [r.tokens_per_sec_per_device for r in ranked]
    assert speeds == sorted(speeds, reverse=True)


def test_predictions_are_core_perf_s_through_the_full_config_path(rows):
    """The plan's fast path (a tree composed once, rebuilt by the dataclasses) against Hydra + OmegaConf."""
    for row in [rows[0], next(r for r in rows if r.params["parallel.pp"] == 2 and r.verdict is not Verdict.INVALID)]:
        expected = estimate_step(planned_config(_overrides(SPACE, row.params)))
        assert row.tokens_per_sec_per_device == pytest.approx(expected.tokens_per_sec_per_device, rel=1e-12)
        assert row.memory_gib * 2**30 == pytest.approx(expected.peak_memory_bytes_per_rank, rel=1e-12)


def test_the_order_does_not_depend_on_the_order_of_the_file(tmp_path, rows):
    shuffled = dict(SPACE)
    shuffled["params"] = {
        k: {**v, "values": list(reversed(v["values"]))} for k, v in reversed(list(SPACE["params"].items()))
    }
    again = plan(load_space(_write(tmp_path, shuffled)))

    def key(rs):
        return [(tuple(sorted(r.params.items())), r.verdict, r.tokens_per_sec_per_device) for r in rs]

    assert key(again) == key(rows)


def test_an_override_of_a_searched_key_pins_it(space_file, rows):
    pinned = plan(load_space(space_file), ["parallel.pp=2"])
    assert {r.params["parallel.pp"] for r in pinned} == {2}
    assert len(pinned) == sum(r.params["parallel.pp"] == 2 for r in rows)


@pytest.mark.parametrize(("override", "key"), [("parallel.tpp=2", "parallel.tpp"), ("parallel.tp=two", "parallel.tp")])
def test_a_bad_override_names_its_key(space_file, override, key):
    with pytest.raises(ConfigError) as info:
        plan(load_space(space_file), [override])
    assert info.value.field == key


def test_the_command_writes_every_point_and_exits_2_naming_a_bad_key(space_file, rows, tmp_path, capsys):
    assert main(["--space", str(space_file), "--out", str(tmp_path), "--top", "3"]) == 0
    table = pd.read_csv(tmp_path / "plan.csv")
    assert len(table) == len(rows)
    assert list(table.verdict) == [r.verdict.value for r in rows]
    assert (tmp_path / "plan.md").read_text().count("\n") >= len(rows)
    assert (tmp_path / "plan.png").stat().st_size > 0
    assert main(["--space", str(space_file), "--out", str(tmp_path), "cluster.nodez=4"]) == 2
    assert "cluster.nodez" in capsys.readouterr().err


def test_the_command_runs_without_mindspore(space_file, tmp_path):
    code = (
        "import runpy, sys\nsys.modules['mindspore'] = None\n"
        "sys.argv = ['autoresearch.plan', *sys.argv[1:]]\nrunpy.run_module('autoresearch.plan', run_name='__main__')\n"
    )
    args = ["--space", str(space_file), "--out", str(tmp_path), "parallel.pp=2", "memory.recompute=full"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "plan-test" in done.stdout and (tmp_path / "plan.csv").exists()


def test_least_recompute_plans_each_point_with_the_fewest_blocks_that_fit(space_file, rows, tmp_path):
    """--least-recompute: each point that recomputes is predicted as core.perf.least_recompute leaves its config
    (through the full config path), none slower than recomputing every block, and the counts reach the table."""
    fitted = plan(load_space(space_file), least_recompute=True)
    before = {tuple(sorted(r.params.items())): r for r in rows}
    spared = zeros = 0
    for row in fitted:
        if row.verdict is Verdict.INVALID:
            continue
        cfg = least_recompute(planned_config(_overrides(SPACE, row.params)))
        assert row.recompute_stage_layers == cfg.memory.recompute_stage_layers
        assert row.tokens_per_sec_per_device == pytest.approx(estimate_step(cfg).tokens_per_sec_per_device, rel=1e-12)
        assert row.tokens_per_sec_per_device >= before[tuple(sorted(row.params.items()))].tokens_per_sec_per_device * (
            1 - 1e-12
        )
        if row.params["memory.recompute"] == "none":
            assert row.recompute_stage_layers is None
        elif not any(row.recompute_stage_layers or [1]):  # the same config as its twin recomputing nothing
            assert row.verdict is Verdict.DOMINATED and "memory.recompute=none" in row.reason
            zeros += 1
        elif row.recompute_stage_layers is not None and row.verdict is not Verdict.MEMORY:
            assert fits_device(cfg)
            spared += (
                row.tokens_per_sec_per_device > before[tuple(sorted(row.params.items()))].tokens_per_sec_per_device
            )
    assert spared and zeros  # some point recomputing every block fits with fewer, and some with none
    assert main(["--space", str(space_file), "--out", str(tmp_path), "--least-recompute"]) == 0
    table = pd.read_csv(tmp_path / "plan.csv")
    assert "memory.recompute_stage_layers" in table.columns


def test_a_space_that_sizes_no_cluster_is_planned_on_one_host_of_its_ranks(tmp_path):
    """As the agent runs such a space (parallel.yaml's kind): every rank of a point on this host, one device
    each, so that points of 1, 2 and 4 ranks are each predicted, none refused for the cluster's size."""
    one_host = {
        **SPACE,
        "world_size": 4,
        "fixed": {k: v for k, v in SPACE["fixed"].items() if k != "cluster.nodes"} | {"model": "llama2-7b"},
        "params": {"parallel.dp_shard": {"type": "choice", "values": [1, 2, 4]}},
        "constraints": [],
    }
    rows = plan(load_space(_write(tmp_path, one_host)))
    assert sorted(r.params["parallel.dp_shard"] for r in rows if r.verdict is not Verdict.INVALID) == [1, 2, 4]
    for row in rows:
        n = row.params["parallel.dp_shard"]
        sized = ["cluster.nodes=1", f"cluster.devices_per_node={n}"]
        expected = estimate_step(planned_config([*_overrides(one_host, row.params), *sized]))
        assert row.tokens_per_sec_per_device == pytest.approx(expected.tokens_per_sec_per_device, rel=1e-12)
        assert row.memory_gib * 2**30 == pytest.approx(expected.peak_memory_bytes_per_rank, rel=1e-12)
