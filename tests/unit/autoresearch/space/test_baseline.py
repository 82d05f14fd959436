"""The space's baseline (autoresearch.space.baseline): the core's defaults, what the file names, and the errors."""

import pytest
import yaml

from autoresearch.space import SpaceError, load_space
from tests.agent_support import MBS, REC, space_file


def _core_space(tmp_path, params, baseline=None, fixed=None):
    doc = {
        "name": "core",
        "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
        "world_size": 2,
        "fixed": {"model": "tiny", "training.global_batch_size": 8, **(fixed or {})},
        "params": params,
        **({"baseline": baseline} if baseline is not None else {}),
    }
    path = tmp_path / "core_space.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_core_space_s_baseline_is_what_its_fixed_settings_alone_run(tmp_path):
    # By hand from configs/: every degree 1, recompute none, jit, adamw; a null micro-batch is the whole batch (8
    # sequences over one data-parallel rank).
    path = _core_space(
        tmp_path,
        {
            "parallel.tp": {"type": "choice", "values": [2, 1]},
            MBS: {"type": "choice", "values": [2, 4, 8]},
            REC: {"type": "choice", "values": ["full", "none"]},
            "training.mode": {"type": "choice", "values": ["pynative", "jit"]},
            "optim": {"type": "choice", "values": ["muon", "adamw"]},
        },
    )
    assert load_space(path).baseline_point == {
        "parallel.tp": 1,
        MBS: 8,
        REC: "none",
        "training.mode": "jit",
        "optim": "adamw",
    }


def test_a_default_the_space_does_not_offer_is_stood_in_for_by_its_nearest_value(tmp_path):
    params = {
        "parallel.tp": {"type": "choice", "values": [1, 2]},
        MBS: {"type": "choice", "values": [1, 2, 4]},  # the whole batch, 8, is not among them: 4 is nearest
        "optim.lr": {"type": "choice", "values": [0.001, 0.01]},  # 0.003: 0.001 is nearer by ratio (3x, 3.3x)
        "optim": {"type": "choice", "values": ["muon"]},  # adamw is not offered: the first value
    }
    space = load_space(_core_space(tmp_path, params))
    assert space.baseline_point == {"parallel.tp": 1, MBS: 4, "optim.lr": 0.001, "optim": "muon"}
    assert space.baseline_substituted == {MBS: (8, 4), "optim.lr": (0.003, 0.001), "optim": ("adamw", "muon")}
    named = load_space(_core_space(tmp_path, params, baseline={MBS: 2}))
    assert named.baseline_point[MBS] == 2 and MBS not in named.baseline_substituted


@pytest.mark.parametrize(
    ("baseline", "key", "words"),
    [
        ({"training.seq_len": 64}, "baseline.training.seq_len", "is not a param"),
        ({MBS: 3}, f"baseline.{MBS}", "not one of 1, 2, 4"),
        ({"parallel.tp": 2, MBS: 4}, "baseline", "constraint violated"),
    ],
)
def test_a_baseline_outside_the_space_is_refused_at_its_key(tmp_path, baseline, key, words):
    params = {"parallel.tp": {"type": "choice", "values": [1, 2]}, MBS: {"type": "choice", "values": [1, 2, 4]}}
    path = _core_space(tmp_path, params, baseline=baseline)
    doc = yaml.safe_load(path.read_text())
    doc["constraints"] = [f"parallel.tp * {MBS} <= 4"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(SpaceError) as err:
        load_space(path).baseline_point  # noqa: B018 (a study forms it; planning does not need it)
    assert err.value.key == key and words in err.value.reason
    assert err.value.line is not None


def test_a_space_of_another_command_has_a_baseline_only_where_it_names_every_param(tmp_path):
    assert load_space(space_file(tmp_path)).baseline_point is None
    named = {MBS: 16, REC: "full", "optim.lr": 0.001}
    assert load_space(space_file(tmp_path, baseline=named)).baseline_point == named
    with pytest.raises(SpaceError) as err:
        load_space(space_file(tmp_path, baseline={MBS: 16})).baseline_point  # noqa: B018
    assert err.value.key == "baseline" and "memory.recompute, optim.lr" in err.value.reason


@pytest.mark.parametrize("name", ["parallel", "hparams", "compile", "cluster-llama3-70b", "cluster-qwen3-moe"])
def test_every_shipped_space_has_a_baseline(name):
    point = load_space(name).baseline_point
    assert point is not None and set(point) == set(load_space(name).params)


def test_parallel_yaml_s_baseline_is_one_process_at_the_core_s_defaults():
    point = load_space("parallel").baseline_point
    degrees = ("dp_replicate", "dp_shard", "tp", "cp", "pp")
    assert all(point[f"parallel.{d}"] == 1 for d in degrees)
    assert (point[MBS], point[REC], point["memory.swap"], point["training.mode"]) == (8, "none", False, "jit")
