"""Search spaces: the YAML schema (each malformed file with its error), and the operations proposers rely on
(check, coerce, constraint values, overrides, grid, JSON schema, sampling). The constraint language is in
test_expr.py, the check against the core's config in test_space_core_check.py."""

from __future__ import annotations

import itertools
import math
import shutil
import textwrap

import numpy as np
import pytest

from autoresearch.space import SPACES_DIR, SearchSpace, SpaceError, load_space
from autoresearch.space.params import FloatParam, IntParam, ParamError
from core.config import format_value

# ---------------------------------------------------------------------------------------------- the schema

GOOD = """\
name: demo
description: a sample space
objective: {metric: val_loss, direction: minimize}
world_size: 2
fixed:
  model: tiny
  training.global_batch_size: 16
params:
  optim.lr: {type: float, low: 1e-4, high: 1e-1, log: true, nan: up, memory: none}
  training.micro_batch_size: {type: int, low: 2, high: 8, step: 2, memory: up}
  memory.recompute: {type: choice, values: [full, none], memory: up}
  parallel.dp_replicate: {type: choice, values: [1, 2]}
constraints:
  - "parallel.dp_replicate <= world_size"
  - "training.global_batch_size % (training.micro_batch_size * parallel.dp_replicate) == 0"
budget: {trials: 12, hours: 0.5, dollars: 1.0}
baseline: {training.micro_batch_size: 8}   # the core's default micro-batch (the whole batch, 16) is not offered
"""


def write(tmp_path, text, name="space.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def space(tmp_path) -> SearchSpace:
    return load_space(str(write(tmp_path, GOOD)))


def test_good_space_loads_with_every_field(space):
    assert (space.name, space.objective_metric, space.direction, space.world_size) == (
        "demo",
        "val_loss",
        "minimize",
        2,
    )
    assert space.fixed == {"model": "tiny", "training.global_batch_size": 16}
    assert list(space.params) == ["optim.lr", "training.micro_batch_size", "memory.recompute", "parallel.dp_replicate"]
    assert space.baseline_point == {
        "optim.lr": 0.003,  # the core's defaults but the one named
        "training.micro_batch_size": 8,
        "memory.recompute": "none",
        "parallel.dp_replicate": 1,
    }
    lr = space.params["optim.lr"]
    assert (lr.type, lr.low, lr.high, lr.log, lr.nan, lr.memory) == ("float", 1e-4, 0.1, True, "up", "none")
    assert space.params["training.micro_batch_size"].step == 2
    assert (space.budget.trials, space.budget.hours, space.budget.dollars) == (12, 0.5, 1.0)


def replace(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new)


LR = "  optim.lr: {type: float, low: 1e-4, high: 1e-1, log: true, nan: up, memory: none}\n"
MB = "  training.micro_batch_size: {type: int, low: 2, high: 8, step: 2, memory: up}\n"

# (id, file text, expected key, expected reason substring, expected line or None)
MALFORMED = [
    ("unknown-top-key", GOOD + "paramz: {}\n", "paramz", "unknown key", 18),
    ("missing-params", "objective: {metric: val_loss, direction: minimize}\n", "params", "is required", None),
    ("missing-objective", "params: {x: {type: int, low: 0, high: 2}}\n", "objective", "is required", None),
    ("not-a-mapping", "- a\n- b\n", "", "must be a mapping", None),
    ("empty-file", "", "file", "is empty", None),
    ("bad-yaml", "params: {x: [1, 2\n", "yaml", "not valid YAML", None),
    ("duplicate-key", replace(MB, MB + MB), "params.training.micro_batch_size", "duplicate key", 11),
    (
        "bad-direction",
        replace("direction: minimize", "direction: lowest"),
        "objective.direction",
        "minimize or maximize",
        3,
    ),
    ("unknown-metric", replace("metric: val_loss", "metric: accuracy"), "objective.metric", "is not a trial metric", 3),
    (
        "objective-extra-key",
        replace("direction: minimize}", "direction: minimize, goal: 1}"),
        "objective.goal",
        "unknown key",
        3,
    ),
    ("world-size-float", replace("world_size: 2", "world_size: 2.5"), "world_size", "must be an integer", 4),
    ("world-size-zero", replace("world_size: 2", "world_size: 0"), "world_size", "must be > 0", 4),
    (
        "unknown-param-key",
        replace(MB, "  training.micro_batch_size: {type: int, low: 2, high: 8, stp: 2}\n"),
        "params.training.micro_batch_size.stp",
        "unknown key; allowed: type, low, high, step",
        10,
    ),
    (
        "unknown-type",
        replace(MB, "  training.micro_batch_size: {type: integer, low: 2, high: 8}\n"),
        "params.training.micro_batch_size.type",
        "must be one of choice, int, float",
        10,
    ),
    (
        "param-not-mapping",
        replace(MB, "  training.micro_batch_size: 4\n"),
        "params.training.micro_batch_size",
        "must be a mapping with a type",
        10,
    ),
    (
        "low-ge-high",
        replace(LR, "  optim.lr: {type: float, low: 0.1, high: 0.1}\n"),
        "params.optim.lr.high",
        "low must be below high",
        9,
    ),
    (
        "log-nonpositive-low",
        replace(LR, "  optim.lr: {type: float, low: 0.0, high: 0.1, log: true}\n"),
        "params.optim.lr.low",
        "needs low > 0",
        9,
    ),
    (
        "int-low-float",
        replace(MB, "  training.micro_batch_size: {type: int, low: 2.5, high: 8}\n"),
        "params.training.micro_batch_size.low",
        "must be an integer",
        10,
    ),
    (
        "float-low-string",
        replace(LR, "  optim.lr: {type: float, low: small, high: 0.1}\n"),
        "params.optim.lr.low",
        "must be a finite number",
        9,
    ),
    (
        "step-off-grid",
        replace(MB, "  training.micro_batch_size: {type: int, low: 2, high: 8, step: 4}\n"),
        "params.training.micro_batch_size.step",
        "not a multiple of step 4",
        10,
    ),
    (
        "log-with-float-step",
        replace(LR, "  optim.lr: {type: float, low: 0.1, high: 0.5, log: true, step: 0.1}\n"),
        "params.optim.lr.step",
        "log and step cannot be combined",
        9,
    ),
    (
        "empty-choice",
        replace("values: [full, none]", "values: []"),
        "params.memory.recompute.values",
        "non-empty list",
        11,
    ),
    (
        "duplicate-choice",
        replace("values: [full, none]", "values: [full, full]"),
        "params.memory.recompute.values",
        "duplicate value full",
        11,
    ),
    (
        "choice-with-low",
        replace("values: [1, 2]}", "values: [1, 2], low: 1}"),
        "params.parallel.dp_replicate.low",
        "unknown key; allowed: type, values",
        12,
    ),
    (
        "bad-annotation",
        replace("memory: up}\n  memory.recompute", "memory: more}\n  memory.recompute"),
        "params.training.micro_batch_size.memory",
        "must be up, down or none",
        10,
    ),
    (
        "reserved-param-name",
        replace(MB, "  world_size: {type: int, low: 1, high: 2}\n"),
        "params.world_size",
        "is reserved",
        10,
    ),
    (
        "param-name-not-dotted",
        replace(MB, "  micro batch: {type: int, low: 1, high: 2}\n"),
        "params.micro batch",
        "is not a dotted name",
        10,
    ),
    ("no-params", GOOD[: GOOD.index("params:")] + "params: {}\n", "params", "needs at least one param", 8),
    ("fixed-collides", replace("model: tiny", "model: tiny\n  optim.lr: 0.01"), "fixed.optim.lr", "is also a param", 7),
    ("fixed-not-scalar", replace("model: tiny", "model: {name: tiny}"), "fixed.model", "must be a scalar", 6),
    (
        "constraint-does-not-parse",
        replace('- "parallel.dp_replicate <= world_size"', '- "parallel.dp_replicate <= "'),
        "constraints[0]",
        "does not parse",
        14,
    ),
    (
        "constraint-unknown-name",
        replace("parallel.dp_replicate <= world_size", "parallel.tp <= world_size"),
        "constraints[0]",
        "unknown name(s) parallel.tp",
        14,
    ),
    (
        "constraint-calls-code",
        replace('- "parallel.dp_replicate <= world_size"', "- \"__import__('os')\""),
        "constraints[0]",
        "does not parse",
        14,
    ),
    (
        "constraint-not-condition",
        replace("parallel.dp_replicate <= world_size", "parallel.dp_replicate + 1"),
        "constraints[0]",
        "is not a condition",
        14,
    ),
    (
        "constraint-not-string",
        replace('- "parallel.dp_replicate <= world_size"', "- 3"),
        "constraints[0]",
        "must be a string",
        14,
    ),
    (
        "constraints-not-list",
        replace('constraints:\n  - "parallel.dp_replicate <= world_size"\n  - ', "constraints: "),
        "constraints",
        "must be a list",
        13,
    ),
    ("budget-unknown-key", replace("dollars: 1.0}", "euros: 1.0}"), "budget.euros", "unknown key", 16),
    ("budget-negative", replace("trials: 12", "trials: -1"), "budget.trials", "must be > 0", 16),
    ("bad-name", replace("name: demo", "name: my space!"), "name", "letters, digits", 1),
    (
        "nodes-do-not-split-the-world",
        GOOD + "resources: {nodes: 3}\n",
        "resources.nodes",
        "does not split evenly over 3 nodes",
        None,
    ),
    (
        "nodes-times-devices-not-the-world",
        GOOD + "resources: {nodes: 2, devices_per_node: 2}\n",
        "resources.devices_per_node",
        "is not the space's world_size 2",
        None,
    ),
    ("slurm-unknown-key", GOOD + "slurm: {queue: gpu}\n", "slurm.queue", "unknown key", 18),
]


def test_resources_default_to_one_node_with_the_whole_world(tmp_path):
    space = load_space(str(write(tmp_path, GOOD)))
    assert (space.resources.nodes, space.devices_per_node, space.resources.cores_per_node) == (1, 2, None)
    space = load_space(str(write(tmp_path, GOOD + "resources: {nodes: 2, cores_per_node: 8}\nslurm: {gres: npu}\n")))
    assert (space.resources.nodes, space.devices_per_node, space.resources.cores_per_node) == (2, 1, 8)
    assert (space.slurm.gres, space.slurm.partition, space.slurm.options) == ("npu", None, [])


@pytest.mark.parametrize("text, key, reason, line", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_space_is_rejected_with_file_key_reason(tmp_path, text, key, reason, line):
    path = write(tmp_path, text)
    with pytest.raises(SpaceError) as info:
        load_space(str(path))
    err = info.value
    assert err.file == str(path)
    assert err.key == key
    assert reason in err.reason
    if line is not None:
        assert err.line == line
    assert str(err).startswith(f"{path}: {key}: ")


def test_yaml_error_carries_its_line(tmp_path):
    path = write(tmp_path, "objective: {metric: val_loss, direction: minimize}\nparams:\n  x: [1, 2\n")
    with pytest.raises(SpaceError) as info:
        load_space(str(path))
    assert info.value.line is not None and info.value.line >= 3


def test_missing_file_lists_where_it_looked(tmp_path):
    with pytest.raises(SpaceError) as info:
        load_space(str(tmp_path / "nope"))
    assert info.value.key == "file" and "not found" in info.value.reason and "parallel.yaml" in info.value.reason


def test_resolution_order_cwd_then_search_spaces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_space("parallel.yaml").path == str(SPACES_DIR / "parallel.yaml")
    assert load_space("parallel").path == str(SPACES_DIR / "parallel.yaml")
    (tmp_path / "parallel.yaml").write_text(GOOD)  # a local file of the same name wins
    assert load_space("parallel.yaml").name == "demo"
    assert load_space("parallel").name == "demo"


def test_param_rules_hold_when_built_in_code():
    with pytest.raises(ParamError) as info:
        IntParam(low=1, high=10, step=1, log=True, memory="sideways")
    assert info.value.field == "memory"
    with pytest.raises(SpaceError, match="is also a param"):
        SearchSpace(
            name="s",
            objective={"metric": "val_loss", "direction": "minimize"},
            fixed={"x": 1},
            params={"x": IntParam(low=0, high=3)},
        )


# ---------------------------------------------------------------------------------------------- operations

GOOD_POINT = {"optim.lr": 0.01, "training.micro_batch_size": 4, "memory.recompute": "none", "parallel.dp_replicate": 2}


def test_check_accepts_a_valid_point_and_ints_for_floats(space):
    assert space.check(GOOD_POINT) == []
    assert space.check({**GOOD_POINT, "optim.lr": 1 / 100}) == []
    assert space.check({**GOOD_POINT, "optim.lr": 0}) == ["optim.lr=0: below the minimum 0.0001"]


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"optim.lr": 0.5}, "optim.lr=0.5: above the maximum 0.1"),
        ({"optim.lr": "0.01"}, "optim.lr='0.01': must be a finite number"),
        ({"training.micro_batch_size": 3}, "training.micro_batch_size=3: not on the grid 2 + k * 2"),
        ({"training.micro_batch_size": 4.0}, "training.micro_batch_size=4.0: must be an integer"),
        ({"training.micro_batch_size": True}, "training.micro_batch_size=True: must be an integer"),
        ({"memory.recompute": "some"}, "memory.recompute='some': not one of full, none"),
        ({"parallel.dp_replicate": True}, "parallel.dp_replicate=True: not one of 1, 2"),
        ({"extra": 1}, "unknown param extra"),
    ],
)
def test_check_names_each_problem(space, change, reason):
    reasons = space.check({**GOOD_POINT, **change})
    assert len(reasons) == 1 and reasons[0].startswith(reason)


def test_check_reports_missing_keys_and_violated_constraints(space):
    point = dict(GOOD_POINT)
    del point["memory.recompute"]
    assert space.check(point) == ["missing param memory.recompute"]
    reasons = space.check({**GOOD_POINT, "training.micro_batch_size": 6})
    assert reasons == [
        "constraint violated: training.global_batch_size % (training.micro_batch_size * "
        "parallel.dp_replicate) == 0 (with parallel.dp_replicate=2, training.global_batch_size=16, "
        "training.micro_batch_size=6)"
    ]


def test_coerce_turns_llm_text_into_typed_values(space):
    raw = {
        "optim.lr": "1e-2",
        "training.micro_batch_size": "4",
        "memory.recompute": "none",
        "parallel.dp_replicate": "2",
        "rationale": "kept as is",
    }
    out = space.coerce(raw)
    assert out == {**GOOD_POINT, "rationale": "kept as is"}
    assert type(out["training.micro_batch_size"]) is int and type(out["parallel.dp_replicate"]) is int
    assert space.coerce({"training.micro_batch_size": 6.0})["training.micro_batch_size"] == 6
    assert space.coerce({"optim.lr": 1})["optim.lr"] == 1.0 and type(space.coerce({"optim.lr": 1})["optim.lr"]) is float
    assert space.coerce({"parallel.dp_replicate": 2.0})["parallel.dp_replicate"] == 2


@pytest.mark.parametrize(
    "change, message",
    [
        ({"training.micro_batch_size": "four"}, "training.micro_batch_size: 'four' is not an integer"),
        ({"training.micro_batch_size": 4.5}, "training.micro_batch_size: 4.5 is not an integer"),
        ({"optim.lr": "nan"}, "optim.lr: nan is not a finite number"),
        ({"optim.lr": None}, "optim.lr: None is not a number"),
        ({"memory.recompute": "partial"}, "memory.recompute: 'partial' is not one of full, none"),
    ],
)
def test_coerce_rejects_with_a_clear_reason(space, change, message):
    with pytest.raises(ValueError) as info:
        space.coerce(change)
    assert str(info.value) == message


def test_constraint_values_are_zero_when_satisfied_and_graded_when_not(space):
    assert space.constraint_values(GOOD_POINT) == [0.0, 0.0]
    assert space.constraint_values({**GOOD_POINT, "training.micro_batch_size": 6}) == [0.0, 4.0]  # 16 % 12


def test_overrides_are_hydra_strings_fixed_first(space):
    assert space.overrides({**GOOD_POINT, "optim.lr": 3e-05}) == [
        "model=tiny",
        "training.global_batch_size=16",
        "optim.lr=3e-05",
        "training.micro_batch_size=4",
        "memory.recompute=none",
        "parallel.dp_replicate=2",
    ]
    with pytest.raises(ValueError, match="missing"):
        space.overrides({"optim.lr": 0.01})


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (0.1, "0.1"),
        (1e-05, "1e-05"),
        (2.0, "2.0"),
        (3, "3"),
        ("adamw", "adamw"),
        ("true", "'true'"),
        ("1", "'1'"),
        ("a b", "'a b'"),
        ("it's", "'it\\'s'"),
    ],
)
def test_override_values_round_trip_through_hydra(value, text):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert format_value(value) == text
    parsed = OverridesParser.create().parse_overrides([f"k={text}"])[0].value()
    assert parsed == value and type(parsed) is type(value)


def test_json_schema_describes_every_param_plus_rationale(space):
    schema = space.json_schema()
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == [*space.params, "rationale"]
    props = schema["properties"]
    assert props["optim.lr"]["type"] == "number"
    assert (props["optim.lr"]["minimum"], props["optim.lr"]["maximum"]) == (1e-4, 0.1)
    assert props["training.micro_batch_size"] == {
        **props["training.micro_batch_size"],
        "type": "integer",
        "minimum": 2,
        "maximum": 8,
        "multipleOf": 2,
    }
    assert props["memory.recompute"]["enum"] == ["full", "none"] and props["memory.recompute"]["type"] == "string"
    assert props["parallel.dp_replicate"]["enum"] == [1, 2]
    assert props["rationale"]["type"] == "string"
    assert "parallel.dp_replicate <= world_size" in schema["description"]


def test_grid_is_the_product_filtered_by_constraints(space):
    grid = space.grid(points_per_float=3)
    lrs = sorted({p["optim.lr"] for p in grid})
    assert lrs == [0.0001, 0.00316227766017, 0.1]  # log-spaced, tidied
    # 3 lr x (4 micro x 2 recompute x 2 dp) minus micro 6 (16 % 6, 16 % 12) and dp 2 with micro 6 or 8 (16 % 16 ok)
    valid = [(m, d) for m in (2, 4, 6, 8) for d in (1, 2) if 16 % (m * d) == 0]
    assert len(grid) == 3 * 2 * len(valid)
    assert all(space.check(p) == [] for p in grid)
    assert grid[0] == {
        "optim.lr": 0.0001,
        "training.micro_batch_size": 2,
        "memory.recompute": "full",
        "parallel.dp_replicate": 1,
    }


def _filtered_product(space: SearchSpace, axes: list | None = None) -> list[dict]:
    """The grid by its definition: the product of ``axes`` (each param's grid values) in file order, filtered by
    ``satisfies``."""
    names = list(space.params)
    axes = axes or [space.params[n].grid_values() for n in names]
    return [p for c in itertools.product(*axes) if space.satisfies(p := dict(zip(names, c, strict=True)))]


def test_pruned_grid_is_the_filtered_product_whatever_the_constraints_read(tmp_path):
    # a constraint on world_size alone, one tying the first param to the last, one that cannot be evaluated for
    # some points (division by zero: those points fail it, as satisfies reads it)
    extra = (
        '  - "world_size >= 2"\n'
        '  - "optim.lr < 0.05 or parallel.dp_replicate == 2"\n'
        '  - "training.micro_batch_size / (parallel.dp_replicate - 1) >= 2"\n'
    )
    text = GOOD.replace("budget:", extra + "budget:").replace("size: 8}", "size: 8, parallel.dp_replicate: 2}")
    space = load_space(str(write(tmp_path, text)))
    grid = space.grid()
    assert grid == _filtered_product(space)
    assert grid and {p["parallel.dp_replicate"] for p in grid} == {2}  # dp_replicate 1 divides by zero
    good = load_space(str(write(tmp_path, GOOD, name="good.yaml")))
    assert good.grid() == _filtered_product(good)


@pytest.mark.parametrize(
    "path", sorted([*SPACES_DIR.glob("*.yaml"), *(SPACES_DIR.parent / "benchmarks" / "spaces").glob("*.yaml")])
)
def test_every_shipped_space_prunes_to_its_filtered_product(path):
    """A product over 50,000 points (filtering it whole would take seconds: the pruning's reason to be) is checked
    on its slice with the leading params at their first grid values."""
    space = load_space(str(path))
    names = list(space.params)
    axes = [space.params[n].grid_values() for n in names]
    pinned = 0
    while math.prod(map(len, axes)) > 50_000:
        axes[pinned], pinned = axes[pinned][:1], pinned + 1
    in_slice = [p for p in space.grid() if all(p[n] == axes[i][0] for i, n in enumerate(names[:pinned]))]
    assert in_slice and in_slice == _filtered_product(space, axes)


def test_grid_values_for_steps_and_long_int_ranges():
    assert FloatParam(low=0.0, high=0.2, step=0.05).grid_values(10) == [0.0, 0.05, 0.1, 0.15, 0.2]
    assert FloatParam(low=0.0, high=1.0, step=0.1).grid_values(3) == [0.0, 0.5, 1.0]
    assert FloatParam(low=0.0, high=0.3).grid_values(4) == [0.0, 0.1, 0.2, 0.3]
    assert IntParam(low=1, high=1000, log=True).grid_values(max_points_per_int=4) == [1, 10, 100, 1000]
    assert IntParam(low=0, high=10, step=5).grid_values() == [0, 5, 10]


def test_sample_random_is_valid_and_reproducible(space):
    a = [space.sample_random(np.random.default_rng(7)) for _ in range(3)]
    b = [space.sample_random(np.random.default_rng(7)) for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(0)
    samples = [space.sample_random(rng) for _ in range(200)]
    assert all(space.check(s) == [] for s in samples)
    assert {s["parallel.dp_replicate"] for s in samples} == {1, 2}


def test_sample_random_raises_when_constraints_are_unsatisfiable(tmp_path):
    text = replace("parallel.dp_replicate <= world_size", "parallel.dp_replicate > world_size")
    space = load_space(str(write(tmp_path, text)))  # (planning asks nothing of the baseline: a study does)
    with pytest.raises(SpaceError, match="baseline: the baseline is not a point of the space: constraint violated"):
        space.baseline_point  # noqa: B018
    with pytest.raises(ValueError, match="no point satisfied the constraints"):
        space.sample_random(np.random.default_rng(0), max_tries=50)
    assert space.grid() == []


def test_distributions_match_the_params(space):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    d = space.distributions()
    assert d["optim.lr"] == FloatDistribution(1e-4, 0.1, log=True)
    assert d["training.micro_batch_size"] == IntDistribution(2, 8, step=2)
    assert d["memory.recompute"] == CategoricalDistribution(["full", "none"])


def test_describe_mentions_objective_params_constraints_and_budget(space):
    text = space.describe()
    for needle in (
        "space demo: a sample space",
        "minimize val_loss",
        "fixed: model=tiny",
        "optim.lr: float in [0.0001, 0.1] log-scale (nan: up)",
        "training.micro_batch_size: int in [2, 8] step 2 (memory: up)",
        "memory.recompute: one of [full, none] (memory: up)",
        "- parallel.dp_replicate <= world_size",
        "budget: 12 trials, 0.5 h, $1.00 LLM",
    ):
        assert needle in text, needle


# ---------------------------------------------------------------------------------------------- shipped spaces


@pytest.mark.parametrize(
    "name, objective, world_size",
    [
        ("parallel", ("tokens_per_sec", "maximize"), 2),
        ("moe", ("val_loss", "minimize"), 2),
        ("hparams", ("val_loss", "minimize"), 1),
        ("hf-qwen3", ("val_loss", "minimize"), 2),
        ("hf-deepseek", ("val_loss", "minimize"), 2),
    ],
)
def test_shipped_spaces_load_with_their_objective_and_budget(name, objective, world_size):
    space = load_space(name)
    assert (space.objective_metric, space.direction, space.world_size) == (*objective, world_size)
    assert space.trial_command == "core.train"  # so load_space checked it against core.config
    assert space.grid() and all(space.check(p) == [] for p in space.grid())
    assert space.budget.trials and space.budget.hours and space.budget.dollars is not None


def test_parallel_space_grid_is_the_layouts_the_core_runs():
    grid = load_space("parallel").grid()
    keys = ("dp_replicate", "dp_shard", "tp", "sp", "cp", "pp", "dp_shard_strategy")
    layouts = {tuple(p[f"parallel.{k}"] for k in keys) for p in grid}
    # every layout of 1 or 2 ranks the core runs; sp only with tp; ZeRO-1 beside FSDP where dp_shard x cp shard
    fsdp, zero1 = "optim_grads_params", "optim"
    assert layouts == {
        (1, 1, 1, False, 1, 1, fsdp),
        (2, 1, 1, False, 1, 1, fsdp),
        (1, 2, 1, False, 1, 1, fsdp),
        (1, 2, 1, False, 1, 1, zero1),
        (1, 1, 2, False, 1, 1, fsdp),
        (1, 1, 2, True, 1, 1, fsdp),
        (1, 1, 1, False, 2, 1, fsdp),
        (1, 1, 1, False, 2, 1, zero1),
        (1, 1, 1, False, 1, 2, fsdp),
    }
    keys = ("pp_schedule", "pp_virtual", "pp_offset", "pp_transpose_layers", "pp_transpose_overflow")
    pipelines = {tuple(p[f"parallel.{k}"] for k in keys) for p in grid if p["parallel.pp"] == 2}
    # gpipe and 1f1b with each offset; interleaved with 2 one-block stages per rank; mpipe over either body, its
    # block (T = 1) only where stage 0 keeps a block of its own (2 or 3 blocks: offset 0 or 1), each overflow policy
    mpipe = {("mpipe", 1, o, t, f) for o in (-1, 0, 1) for t in (0, 1) for f in ("full", "min") if not (t and o < 0)}
    assert pipelines == (
        {(s, 1, o, 0, "full") for s in ("gpipe", "1f1b") for o in (-1, 0, 1)}
        | {("interleaved", 2, 0, 0, "full")}
        | mpipe
        | {("mpipe", 2, 0, 0, f) for f in ("full", "min")}
    )
    # one batch rank (1 process, tp, tp+sp, cp and cp under ZeRO-1): micro 1, 2, 4, 8; two (dp_replicate or
    # dp_shard = 2, FSDP or ZeRO-1): micro 1, 2, 4, as 8 % (8 * 2) != 0; a pipeline: 6 (schedule, offset) pairs at micro 1, 2, 4, 8, interleaved only
    # with an even number of micro-batches (micro 1, 2, 4); mpipe's 5 (offset, T) pairs at each micro with full,
    # and with min only where there are more micro-batches than stages (micro 1, 2), over an interleaved body at
    # micro 1, 2, 4 (full) or 1, 2 (min) -- times (recompute, swap, mode): none and full in both modes, selective
    # in PyNative only, and without a pipeline SWAP (PyNative, no recompute)
    mpipe_points = 5 * 4 + 5 * 2 + 3 + 2
    assert len(grid) == (5 * 4 + 3 * 3) * 6 + (4 * 6 + 3 + mpipe_points) * 5


@pytest.mark.skipif(not (SPACES_DIR.parent / "configs" / "train.yaml").exists(), reason="configs/ not written yet")
@pytest.mark.parametrize("name, stride", [("parallel", 5), ("moe", 5), ("hparams", 7)])
def test_shipped_space_points_compose_into_valid_configs(name, stride):
    from core.config import load_config

    space = load_space(name)
    points = space.grid(points_per_float=2)[::stride]  # a spread in which every value of every param appears
    for key, param in space.params.items():
        assert {str(p[key]) for p in points} == {str(v) for v in param.grid_values(2)}
    for point in points:
        load_config(space.overrides(point))  # raises ConfigError on a key or rule the core rejects


def test_a_relative_hf_model_names_a_directory_beside_the_space_file(tmp_path, monkeypatch):
    """model: hf:<relative dir> in fixed values and choices resolves against the space file, wherever the agent
    runs from; an absolute one is kept."""
    (tmp_path / "spaces" / "m").mkdir(parents=True)
    shutil.copy(SPACES_DIR / "hf" / "qwen3-tiny" / "config.json", tmp_path / "spaces" / "m" / "config.json")
    (tmp_path / "spaces" / "s.yaml").write_text(
        "objective: {metric: val_loss, direction: minimize}\nworld_size: 1\n"
        "fixed: {model: hf:m}\nparams:\n  optim.lr: {type: float, low: 0.001, high: 0.01}\n"
    )
    monkeypatch.chdir(tmp_path)  # elsewhere than the file
    assert load_space(tmp_path / "spaces" / "s.yaml").fixed["model"] == f"hf:{tmp_path / 'spaces' / 'm'}"
    (tmp_path / "spaces" / "bad.yaml").write_text(
        "objective: {metric: val_loss, direction: minimize}\nworld_size: 1\n"
        "fixed: {model: hf:nothing-here}\nparams:\n  optim.lr: {type: float, low: 0.001, high: 0.01}\n"
    )
    with pytest.raises(SpaceError, match="fixed.model"):
        load_space(tmp_path / "spaces" / "bad.yaml")
