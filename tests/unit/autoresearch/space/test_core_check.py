"""A space is checked against the training core's config when it loads (autoresearch.space.core_check), as a new user
would meet it: a few dozen malformed spaces, each refused with the file, the key, the line, the reason and a fix
(SpaceError; the agent exits 2 before any trial), and every shipped space loading cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch import cli as agent
from autoresearch.core_adapter import config_error
from autoresearch.space import SPACES_DIR, SpaceError, load_space
from core.config import ConfigError, load_config
from tests.agent_support import FAKE

ROOT = Path(__file__).resolve().parents[4]

# A valid space of the core (line numbers on the right are what the cases below expect).
BASE = """\
name: base
description: a small space of the core
objective: {metric: val_loss, direction: minimize}
world_size: 2
fixed:
  model: tiny
  training.global_batch_size: 8
  trial.max_steps: 5
params:
  optim.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
  training.micro_batch_size: {type: choice, values: [1, 2, 4]}
  optim: {type: choice, values: [adamw, muon]}
  parallel.tp: {type: choice, values: [1, 2]}
  parallel.sp: {type: choice, values: [false, true]}
  memory.recompute: {type: choice, values: [none, full]}
constraints:
  - "parallel.tp > 1 or not parallel.sp"
baseline: {training.micro_batch_size: 4}
"""
BASELINE_LINE = "baseline: {training.micro_batch_size: 4}\n"
LINE = {text.split(":")[0].strip(): i + 1 for i, text in enumerate(BASE.splitlines()) if not text.startswith("  -")}
LINE["constraint"] = 17


def as_other(text: str) -> str:
    """A space of another trial command: its keys not checked, and no baseline unless it names every param's."""
    return text.replace("world_size: 2", "world_size: 2\ntrial_command: other").replace(BASELINE_LINE, "")


def edit(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new)


def fixed(line: str) -> str:
    """BASE with one more fixed value, on line 9."""
    return edit("  trial.max_steps: 5\n", f"  trial.max_steps: 5\n  {line}\n")


def constraint(text: str) -> str:
    """BASE with its one constraint (line 17) replaced."""
    return edit('"parallel.tp > 1 or not parallel.sp"', f'"{text}"')


def param(line: str) -> str:
    """BASE with one more param, on line 16."""
    return edit(
        "  memory.recompute: {type: choice, values: [none, full]}\n",
        f"  memory.recompute: {{type: choice, values: [none, full]}}\n  {line}\n",
    )


# (id, file text, key, reason substring, fix substring, line)
CASES = [
    # keys the core does not have
    (
        "misspelt-fixed-key",
        fixed("trainng.mode: jit"),
        "fixed.trainng.mode",
        "is not a key of core.train's config",
        "did you mean training.mode?",
        9,
    ),
    (
        "misspelt-param-key",
        param("memory.recompte: {type: choice, values: [none, full]}"),
        "params.memory.recompte",
        "is not a key of core.train's config",
        "did you mean memory.recompute",
        16,
    ),
    ("unknown-section", fixed("optimizer.lr: 0.01"), "fixed.optimizer.lr", "is not a key", "did you mean optim.lr?", 9),
    (
        "unknown-key-no-match",
        fixed("banana: 1"),
        "fixed.banana",
        "is not a key",
        "keys are <section>.<field> (sections: checkpoint, cluster, data, execution, memory, model, optim, parallel",
        9,
    ),
    ("fake-trial-key", fixed("fake.sleep: 0"), "fixed.fake.sleep", "is not a key", "trial_command: other", 9),
    ("too-deep-key", fixed("model.n_layers.x: 1"), "fixed.model.n_layers.x", "is not a key", "did you mean", 9),
    # group options that do not exist
    (
        "misspelt-model",
        edit("model: tiny", "model: tinny"),
        "fixed.model",
        "tinny is not an option of the config group model",
        "choose one of deepseek-tiny, deepseek-v3, llama2-13b, llama2-70b, llama2-7b, llama3-70b, llama3-8b, llama3.1-405b, medium,",
        LINE["model"],
    ),
    (
        "misspelt-optimizer-choice",
        edit("values: [adamw, muon]", "values: [adamw, muonn]"),
        "params.optim.values[1]",
        "muonn is not an option of the config group optim",
        "choose one of adamw, muon",
        LINE["optim"],
    ),
    (
        "group-as-number",
        edit("model: tiny", "model: 3"),
        "fixed.model",
        "3 is not an option",
        "choose one of",
        LINE["model"],
    ),
    (
        "group-as-range",
        param("parallel: {type: int, low: 1, high: 2}"),
        "params.parallel.low",
        "1 is not an option of the config group parallel",
        "choose one of default",
        16,
    ),
    # values of the wrong type
    (
        "float-for-int-fixed",
        edit("global_batch_size: 8", "global_batch_size: 8.5"),
        "fixed.training.global_batch_size",
        "must be an integer, the type of core.config's training.global_batch_size (got float 8.5)",
        "must be an integer",
        LINE["training.global_batch_size"],
    ),
    (
        "quoted-number",
        edit("trial.max_steps: 5", "trial.max_steps: '5'"),
        "fixed.trial.max_steps",
        "must be an integer or null",
        "(got str '5')",
        LINE["trial.max_steps"],
    ),
    (
        "float-choice-for-int",
        edit("values: [1, 2, 4]", "values: [1, 2.5, 4]"),
        "params.training.micro_batch_size.values[1]",
        "must be an integer or null",
        "(got float 2.5)",
        LINE["training.micro_batch_size"],
    ),
    (
        "bool-choice-for-int",
        edit("values: [1, 2]}", "values: [1, true]}"),
        "params.parallel.tp.values[1]",
        "must be an integer",
        "(got bool True)",
        LINE["parallel.tp"],
    ),
    (
        "int-choice-for-bool",
        edit("values: [false, true]", "values: [false, 1]"),
        "params.parallel.sp.values[1]",
        "must be true or false",
        "(got int 1)",
        LINE["parallel.sp"],
    ),
    ("number-for-string", fixed("training.mode: 1"), "fixed.training.mode", "must be a string", "(got int 1)", 9),
    (
        "null-for-required",
        fixed("training.seq_len: null"),
        "fixed.training.seq_len",
        "must be an integer",
        "(got null)",
        9,
    ),
    (
        "list-setting",
        fixed("memory.swap_ops: attention"),
        "fixed.memory.swap_ops",
        "must be a list of strings or null",
        "(got str 'attention')",
        9,
    ),
    (
        "list-of-the-wrong-type",
        fixed("memory.swap_ops: [1]"),
        "fixed.memory.swap_ops",
        "must be a list of strings or null",
        "(got list [1])",
        9,
    ),
    (
        "float-range-for-int",
        edit(
            "training.micro_batch_size: {type: choice, values: [1, 2, 4]}",
            "training.micro_batch_size: {type: float, low: 1, high: 4}",
        ),
        "params.training.micro_batch_size.low",
        "must be an integer or null",
        "(got float 1.0)",
        LINE["training.micro_batch_size"],
    ),
    (
        "int-range-for-string",
        param("training.mode: {type: int, low: 0, high: 1}"),
        "params.training.mode.low",
        "must be a string",
        "(got int 0)",
        16,
    ),
    # values the core's own field and group checks refuse whatever the other params are
    (
        "negative-global-batch",
        edit("global_batch_size: 8", "global_batch_size: -8"),
        "fixed.training.global_batch_size",
        "core.train refuses the fixed values whatever the params are",
        "must be > 0 (got -8)",
        LINE["training.global_batch_size"],
    ),
    (
        "negative-micro-batch",
        edit("values: [1, 2, 4]", "values: [1, -2, 4]"),
        "params.training.micro_batch_size.values[1]",
        "training.micro_batch_size=-2 is refused by core.train's config whatever the other params are",
        "remove -2 from values",
        LINE["training.micro_batch_size"],
    ),
    (
        "zero-micro-batch-bound",
        edit(
            "training.micro_batch_size: {type: choice, values: [1, 2, 4]}",
            "training.micro_batch_size: {type: int, low: 0, high: 4}",
        ),
        "params.training.micro_batch_size.low",
        "must be > 0 or null",
        "choose another low",
        LINE["training.micro_batch_size"],
    ),
    (
        "lr-bound-zero",
        edit("low: 1.0e-4, high: 1.0e-2, log: true", "low: 0.0, high: 1.0e-2"),
        "params.optim.lr.low",
        "optim.lr: must be > 0 (got 0.0)",
        "choose another low",
        LINE["optim.lr"],
    ),
    (
        "beta-bound-out-of-range",
        param("optim.beta1: {type: float, low: 0.5, high: 1.0}"),
        "params.optim.beta1.high",
        "optim.beta1: must be in [0, 1)",
        "choose another high",
        16,
    ),
    (
        "negative-warmup-bound",
        param("optim.warmup_steps: {type: int, low: -5, high: 5}"),
        "params.optim.warmup_steps.low",
        "optim.warmup_steps: must be >= 0",
        "choose another low",
        16,
    ),
    (
        "misspelt-recompute-option",
        edit("values: [none, full]", "values: [none, ful]"),
        "params.memory.recompute.values[1]",
        "must be one of none, selective, selective_op, full (got 'ful')",
        "remove ful from values",
        LINE["memory.recompute"],
    ),
    (
        "tp-dividing-nothing",
        edit("values: [1, 2]}", "values: [1, 3]}"),
        "params.parallel.tp.values[1]",
        "3 does not divide model.n_heads=4",
        "choose a tp that divides n_heads",
        LINE["parallel.tp"],
    ),
    (
        "value-refused-with-a-fixed-value",
        fixed("memory.swap: true").replace(
            "memory.recompute: {type: choice, values: [none, full]}",
            "training.mode: {type: choice, values: [jit, pynative]}",
        ),
        "params.training.mode.values[0]",
        "memory.swap: needs training.mode=pynative",
        "remove jit from values",
        16,
    ),
    (
        "swap-under-jit",
        fixed("memory.swap: true"),
        "fixed.memory.swap",
        "core.train refuses the fixed values whatever the params are",
        "needs training.mode=pynative",
        9,
    ),
    (
        "recompute-refused-with-swap",
        fixed("memory.swap: true\n  training.mode: pynative"),
        "params.memory.recompute.values[1]",
        "memory.recompute=full is refused",
        "memory.swap: runs without a pipeline and without recompute",
        17,
    ),
    (
        "seq-longer-than-model",
        fixed("training.seq_len: 512"),
        "fixed.training.seq_len",
        "training.seq_len: 512 exceeds model.max_seq_len=256",
        "lower it or raise model.max_seq_len",
        9,
    ),
    (
        "fixed-breaking-another-field",
        fixed("model.n_heads: 3"),
        "fixed",
        "model.d_model: must be divisible by model.n_heads=3",
        "core.train refuses the fixed values",
        LINE["fixed"],
    ),
    (
        "jit-level",
        fixed("execution.jit_level: O2"),
        "fixed.execution.jit_level",
        "must be O0 or O1 (got 'O2')",
        "refuses the fixed values",
        9,
    ),
    ("device", fixed("device: TPU"), "fixed.device", "must be CPU, Ascend or GPU", "refuses the fixed values", 9),
    (
        "zero-steps",
        edit("trial.max_steps: 5", "trial.max_steps: 0"),
        "fixed.trial.max_steps",
        "must be > 0 or null",
        "refuses the fixed values",
        LINE["trial.max_steps"],
    ),
    (
        "ep-without-experts",
        param("parallel.ep: {type: choice, values: [1, 2]}"),
        "params.parallel.ep.values[1]",
        "splits an MoE model's experts",
        "choose model=moe-tiny or moe-small",
        16,
    ),
    # the file's own schema (autoresearch.space.file)
    (
        "trial-command-typo",
        edit("world_size: 2", "world_size: 2\ntrial_command: core"),
        "trial_command",
        "must be core.train or other (got str 'core')",
        "core.train or other",
        LINE["world_size"] + 1,
    ),
    (
        "misspelt-top-key",
        edit("world_size: 2", "wold_size: 2"),
        "wold_size",
        "unknown key; allowed: name, description, trial_command, objective, world_size",
        "world_size",
        LINE["world_size"],
    ),
]
# Constraints that do not parse or name what the space lacks (autoresearch.space.expr): (id, text, reason, fix).
CONSTRAINTS = [
    ("syntax", "parallel.tp > or not parallel.sp", "does not parse", "expected an operator or the end, found 'or'"),
    ("incomplete", "parallel.tp >", "does not parse", "found end of input"),
    ("call", "len(parallel.tp) > 1", "calling len() is not allowed", "only min() and max() may be called"),
    (
        "attribute-call",
        "parallel.tp.bit_length() > 1",
        "calling parallel.tp.bit_length() is not allowed",
        "only min() and max()",
    ),
    ("dunder", "parallel.tp.__class__ == 1", "names starting with '__' are reserved", "(at column 1)"),
    ("subscript", "parallel.tp[0] == 1", "subscripts are not allowed", "(at column 1)"),
    ("power", "parallel.tp ** 2 <= 4", "'**' is not allowed", "does not parse"),
    (
        "unknown-name",
        "parallel.pp > 1",
        "uses unknown name(s) parallel.pp",
        "constraints may use params, fixed keys and world_size",
    ),
]
CASES += [
    (f"constraint-{name}", constraint(text), "constraints[0]", reason, fix, LINE["constraint"])
    for name, text, reason, fix in CONSTRAINTS
]


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_base_space_is_valid(tmp_path):
    assert (LINE["model"], LINE["optim.lr"], LINE["memory.recompute"], LINE["constraint"]) == (6, 10, 15, 17)
    space = load_space(str(write(tmp_path, BASE)))
    assert space.trial_command == "core.train" and list(space.params)[-1] == "memory.recompute"


@pytest.mark.parametrize("text, key, reason, fix, line", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_space_is_refused_at_load(tmp_path, text, key, reason, fix, line):
    path = write(tmp_path, text)
    with pytest.raises(SpaceError) as info:
        load_space(str(path))
    err = info.value
    assert (err.file, err.key, err.line) == (str(path), key, line), str(err)
    assert reason in err.reason and fix in err.reason, err.reason
    assert str(err) == f"{path}: {key}: {err.reason} (line {line})"


def test_a_clash_between_params_is_left_to_the_trial(tmp_path):
    """sp=true fails with tp=1 and runs with tp=2: no constraint needed for the space to load. And a value the
    constraints never allow (tp=3) is not the core's concern: nothing would run it."""
    text = edit('  - "parallel.tp > 1 or not parallel.sp"\n', '  - "parallel.tp < 3"\n')
    text = text.replace("values: [1, 2]}", "values: [1, 2, 3]}")
    space = load_space(str(write(tmp_path, text)))
    assert space.params["parallel.tp"].values == [1, 2, 3]
    # and the pipeline settings of parallel.yaml: pp_virtual=2 is only valid with the interleaved schedule
    # and pp=2, so it is refused alone and accepted by the loader.
    assert config_error({"model": "small", "parallel.pp_virtual": 2}) is not None
    assert "parallel.pp_virtual" in load_space("parallel").params


def test_a_space_for_another_command_is_not_checked(tmp_path):
    space = load_space(str(write(tmp_path, as_other(fixed("fake.sleep: 0")))))
    assert space.trial_command == "other" and space.fixed["fake.sleep"] == 0


@pytest.mark.parametrize(
    "path",
    sorted(SPACES_DIR.glob("*.yaml")) + sorted((ROOT / "benchmarks" / "spaces").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_every_shipped_space_loads_cleanly(path):
    space = load_space(str(path))
    assert space.trial_command == "core.train" and space.params


@pytest.mark.parametrize(
    "settings",
    [
        {"model": "small", "optim": "muon", "optim.lr": 0.01, "training.micro_batch_size": 2},  # valid
        {"model": "tiny", "training.micro_batch_size": -2},
        {"model": "tiny", "parallel.tp": 3},
        {"model": "moe-tiny", "parallel.ep": 2, "parallel.dp_shard": 1},
        {
            "model": "small",
            "parallel.pp": 2,
            "parallel.pp_virtual": 2,
            "parallel.pp_schedule": "interleaved",
            "training.global_batch_size": 8,
            "training.micro_batch_size": 4,
        },
        {"training.mode": "jit", "memory.recompute": "selective"},
        {"model": "tiny", "model.moe_capacity_factor": None, "parallel.sp": True, "parallel.tp": 2},
        # a fixed list (the core's list keys): as load_config reads [full,none]
        {"model": "small", "parallel.pp": 2, "memory.recompute_stages": ["full", "none"]},
        {"model": "small", "parallel.pp": 2, "memory.recompute_stages": ["full", "nonsense"]},
        {"model": "small", "memory.recompute_stages": ["full", "none"]},
    ],
)
def test_the_check_composes_configs_as_load_config_does(settings):
    """The loader sets values into a tree Hydra composed once per group choice; a trial runs load_config on its
    overrides. Both must reach the same verdict."""
    from core.config import format_value

    try:
        load_config([f"{k}={format_value(v)}" for k, v in settings.items()])
        expected = None
    except ConfigError as exc:
        expected = str(exc)
    got = config_error(settings)
    if expected is None or "Hydra cannot override" not in str(got):
        assert (None if got is None else str(got)) == expected
    else:  # the same refusal, said with the group file that lacks the key
        assert expected.startswith(f"{got.field}: ") and "is not in struct" in expected


def test_the_agent_exits_2_before_any_trial(tmp_path, capsys):
    path = write(tmp_path, edit("values: [1, 2, 4]", "values: [1, -2, 4]"))
    code = agent.main(["--space", str(path), "--trials-dir", str(tmp_path / "trials"), "--proposer", "random"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: {path}: params.training.micro_batch_size.values[1]: ")
    assert err.rstrip().endswith(f"(line {LINE['training.micro_batch_size']})")
    assert not (tmp_path / "trials").exists()  # no study, no trial


def test_the_agent_refuses_a_space_of_another_command_with_its_own(tmp_path, capsys):
    """trial_command: other means the keys are not core.train's: the default command would run them anyway."""
    text = as_other(fixed("fake.sleep: 0"))
    path = write(tmp_path, text)
    assert agent.main(["--space", str(path), "--trials-dir", str(tmp_path / "trials"), "--proposer", "random"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: trial_command: is other, but the agent runs its trials with python -m core.train" in err
    assert "--command" in err and "(line 5)" in err
    assert not (tmp_path / "trials").exists()


def test_the_agent_process_exits_2_with_the_message(tmp_path):
    path = write(tmp_path, edit("model: tiny", "model: tinny"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoresearch.agent",
            "--space",
            str(path),
            "--trials-dir",
            str(tmp_path / "trials"),
            "--proposer",
            "random",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"error: {path}: fixed.model: tinny is not an option of the config group model" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_fake_command_still_runs_spaces_of_the_core(tmp_path):
    """A core space with another --command (a wrapper around core.train, or a test's fake) is checked and runs."""
    text = BASE.replace("name: base", "name: wrapped")
    path = write(tmp_path, text)
    code = agent.main(
        [
            "--space",
            str(path),
            "--trials-dir",
            str(tmp_path / "trials"),
            "--command",
            FAKE,
            "--estimator",
            "none",
            "--proposer",
            "random",
            "--trials",
            "1",
            "--confirm",
            "0",
            "--no-progress",
        ]
    )
    assert code == 0
    assert len(list((tmp_path / "trials" / "wrapped").glob("*/trial_summary.json"))) == 1
