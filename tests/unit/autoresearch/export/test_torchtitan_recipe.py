"""The exported torchtitan recipe, loaded by torchtitan 0.3.0 itself: ``ConfigManager().parse_args(["--module", ...,
"--config", "tuned"])``, the call ``torchtitan.train`` makes, with its checks (Trainer.Config.__post_init__), then
torch's pipeline schedule lookup and torchtitan's ParallelDims for the degrees. Every field the target writes must
come back as the table maps the core's config, and back again to that config.

Needs the optional extra (``pip install -e ".[titan]"``, Python >= 3.11); without it the module is skipped."""

from __future__ import annotations

import sys
import uuid
from types import SimpleNamespace

import pytest

from autoresearch import export
from autoresearch.export.recipe import read_recipe, recipe_text
from autoresearch.export.targets import TARGETS, canonical, export_config, flatten, import_config, unflatten
from autoresearch.study.storage import load_study
from tests.unit.autoresearch.export.test_export import CASES, fake_study, flat  # noqa: F401 (fake_study: a fixture)

if sys.version_info < (3, 11):
    pytest.skip("torchtitan 0.3.0 needs Python >= 3.11", allow_module_level=True)
pytest.importorskip(
    "torchtitan",
    minversion="0.3.0",
    reason="torchtitan >= 0.3.0 is not installed (the optional extra: pip install -e '.[titan]')",
)

TITAN = TARGETS["torchtitan"]

# Layouts torchtitan must take as the core ran them, and the core's learning-rate and recompute settings.
LAYOUTS = {
    "pp-uneven-interleaved": [
        "model=small",
        "model.n_layers=6",
        "parallel.dp_shard=2",
        "parallel.pp=2",
        "parallel.pp_virtual=2",
        "parallel.pp_schedule=interleaved",
        "parallel.pp_layers=[2,1,1,2]",
        "training.global_batch_size=16",
        "training.micro_batch_size=2",
    ],
    "pp-gpipe-offset": [
        "model=small",
        "parallel.pp=2",
        "parallel.pp_offset=1",
        "parallel.pp_schedule=gpipe",
        "training.micro_batch_size=2",
    ],
    "pp-1f1b-hsdp-tp-sp-cp": CASES["hsdp-tp-sp-cp-pp"],
    "tp-sp": ["model=small", "parallel.tp=2", "parallel.sp=true"],
    "tp-no-sp": ["model=small", "parallel.tp=2", "parallel.sp=false"],
    "cp-hsdp": ["model=small", "parallel.cp=2", "parallel.dp_replicate=2", "parallel.dp_shard=2"],
    "ep-moe": CASES["moe-ep"],
    "ep-moe-tp": ["model=moe-tiny", "parallel.dp_shard=2", "parallel.tp=2", "parallel.ep=2"],
}
TRAINING = {  # selective recompute runs in PyNative (the core refuses it under jit on CPU)
    f"{recompute}-{schedule}": [
        "model=tiny",
        f"memory.recompute={recompute}",
        f"optim.schedule={schedule}",
        *(["training.mode=pynative"] if recompute == "selective" else []),
    ]
    for recompute in ("none", "selective", "full")
    for schedule in ("cosine", "linear", "wsd", "constant")
} | {
    "clipping-off-eager-seeded": ["model=tiny", "optim.grad_clip=0", "training.mode=pynative", "seed=7"],
    "adamw-settings": ["optim.lr=0.0007", "optim.beta2=0.99", "optim.eps=1e-6", "optim.weight_decay=0.05"],
}


@pytest.fixture(scope="module")
def titan():
    """torchtitan's loader and the classes the checks name, imported once a module (torchtitan.trainer, which a
    recipe imports, takes seconds)."""
    import torchtitan.trainer  # noqa: F401
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    policies = {"none": type(None), "selective": SelectiveAC.Config, "full": FullAC.Config}
    return SimpleNamespace(
        ConfigManager=ConfigManager, ParallelDims=ParallelDims, schedule=get_schedule_class, policies=policies
    )


@pytest.fixture
def load(titan, tmp_path, monkeypatch):
    """Write a recipe as an importable module of its own and load it as ``torchtitan.train`` does."""
    names = []

    def load(text: str, *flags: str):
        names.append(f"tuned_{uuid.uuid4().hex}")  # a fresh name: ConfigManager imports it with importlib
        (tmp_path / f"{names[-1]}.py").write_text(text)
        monkeypatch.syspath_prepend(str(tmp_path))
        return titan.ConfigManager().parse_args(["--module", names[-1], "--config", "tuned", *flags])

    yield load
    for name in names:
        sys.modules.pop(name, None)


def check(titan, config, core: dict, fields: dict) -> None:
    """The loaded config holds every exported field; torchtitan's and torch's own helpers accept its degrees and
    schedule; and the fields give the core's config back (on the table's canonical form)."""
    assert read_recipe(config, fields) == fields
    p = config.parallelism
    assert isinstance(config.activation_checkpoint, titan.policies[fields.get("activation_checkpoint", "selective")])
    world = core["parallel.dp_replicate"] * core["parallel.dp_shard"] * core["parallel.tp"] * core["parallel.pp"]
    titan.ParallelDims.from_config(p, world_size=world * core["parallel.cp"])
    titan.schedule(p.pipeline_parallel_schedule)
    if "optimizer.lr" in fields:
        assert [g.optimizer_name for g in config.optimizer.param_groups] == ["AdamW"]
    exported = export_config(TITAN, core)
    carried = [k for k in TITAN.mapped_keys() if k not in exported.dropped]
    base = flat() | {k: v for k, v in core.items() if k not in carried}
    back, want = canonical(import_config(TITAN, unflatten(fields), base)), canonical(core)
    assert {k: back[k] for k in carried} == {k: want[k] for k in carried}


def test_the_studys_winner_loads(fake_study, titan, load):  # noqa: F811
    study = load_study(fake_study)
    trial = export.pick_trial(study)
    core = flatten(export.resolved_config(study, trial).config)
    fields = flatten(export_config(TITAN, core).doc)
    config = load(export.export_trial(study, trial, "torchtitan").text)
    check(titan, config, core, fields)
    assert config.model_spec is None  # BASE = None: Trainer.Config()'s defaults, which name no model


@pytest.mark.parametrize("case", [*LAYOUTS, *TRAINING])
def test_each_layout_and_setting_loads_as_the_table_maps_it(case, titan, load):
    core = flat(*(LAYOUTS | TRAINING)[case])
    exported = export_config(TITAN, core)
    config = load(recipe_text(exported.doc, ["# a hand-made config"]))
    check(titan, config, core, flatten(exported.doc))


def test_the_pipeline_fields_are_torchtitans_own_checks(titan, load):
    """The recipe writes what torchtitan's checks ask for: without training.disable_cuda_graphs, or with a local
    batch that is no multiple of the micro-batch, the same recipe does not load."""
    text = recipe_text(export_config(TITAN, flat(*LAYOUTS["pp-uneven-interleaved"])).doc, [])
    config = load(text)
    assert config.parallelism.module_fqns_per_model_part[-1][-2:] == ["norm", "lm_head"]
    assert (config.training.local_batch_size, config.parallelism.pipeline_parallel_microbatch_size) == (8, 2)
    with pytest.raises(SystemExit):
        load(text.replace("    config.training.disable_cuda_graphs = True\n", ""))
    with pytest.raises(SystemExit):
        load(text, "--training.local_batch_size", "7")


def test_the_recipe_goes_on_top_of_a_base_recipe(titan, load):
    """With BASE set, the base's model, data and tokenizer stay and the tuned fields are set; flags still override."""
    core = flat(*LAYOUTS["tp-sp"])
    fields = flatten(export_config(TITAN, core).doc)
    base = 'BASE = "torchtitan.models.llama3.config_registry:llama3_debugmodel"'
    text = recipe_text(unflatten(fields), []).replace("\nBASE = None\n", f"\n{base}\n")
    config = load(text, "--training.steps", "7")
    assert config.model_spec is not None and config.model_spec.name == "llama3"
    assert config.dataloader.dataset == "c4_test" and config.training.steps == 7
    check(titan, config, core, fields)
