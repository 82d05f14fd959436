"""The torchtitan recipe as text, without torchtitan: it parses, its ``apply`` sets exactly the exported fields (run
against the stand-in of tests/unit/autoresearch/export/stand_in.py), the base's other fields stay, and it imports
only what it uses. test_torchtitan_recipe.py loads the same text with the real package."""

from __future__ import annotations

import ast
import math
import sys
import types

import pytest

from autoresearch.export.recipe import literal, read_recipe, recipe_text
from autoresearch.export.targets import TARGETS, export_config, flatten
from tests.unit.autoresearch.export.stand_in import Recorder, recipe_fields, run_recipe
from tests.unit.autoresearch.export.test_export import CASES, flat

HEADER = ["# torchtitan 0.3.0 recipe", "# not exported (the model is the base recipe's model_spec): model.n_layers=4"]


def exported(case: str) -> dict:
    return export_config(TARGETS["torchtitan"], flat(*CASES[case])).doc


@pytest.mark.parametrize("case", CASES)
def test_the_recipe_parses_and_sets_exactly_the_exported_fields(case, monkeypatch):
    doc = exported(case)
    text = recipe_text(doc, HEADER)
    tree = ast.parse(text)
    compile(tree, "tuned_recipe.py", "exec")
    assert text.splitlines()[:2] == HEADER and ast.get_docstring(tree).startswith("The study's tuned settings")
    fields = flatten(doc)
    _, assigned = run_recipe(text, monkeypatch)
    optimizer = {"optimizer"} if any(k.startswith("optimizer.") for k in fields) else set()
    assert set(assigned) == {k for k in fields if not k.startswith("optimizer.")} | optimizer
    assert recipe_fields(text, monkeypatch) == fields


def test_apply_goes_on_top_of_the_base_and_leaves_its_other_fields(monkeypatch):
    assigned: dict = {}

    def llama() -> Recorder:
        config = Recorder(assigned)
        config.model_spec, config.lr_scheduler.total_steps, config.training.steps = "llama3 8B", 500, 1000
        config.parallelism.data_parallel_shard_degree = -1
        assigned.clear()  # from here on: what apply assigns
        return config

    monkeypatch.setitem(sys.modules, "base_recipes", types.SimpleNamespace(llama=llama))
    doc = exported("hsdp-tp-sp-cp-pp")
    text = recipe_text(doc, HEADER).replace("\nBASE = None\n", '\nBASE = "base_recipes:llama"\n')
    config, from_defaults = run_recipe(text, monkeypatch)
    assert from_defaults == {}  # Trainer.Config() never built: BASE was
    assert (config.model_spec, config.lr_scheduler.total_steps, config.training.steps) == ("llama3 8B", 500, 1000)
    assert config.parallelism.data_parallel_shard_degree == 2 and config.parallelism.tensor_parallel_degree == 2
    assert set(assigned) == {k for k in flatten(doc) if not k.startswith("optimizer.")} | {"optimizer"}


def test_the_recipe_imports_what_it_uses_only():
    text = recipe_text(exported("offset-constant"), [])  # selective recompute, clipping off (math.inf)
    assert "import math\n" in text and "config.training.max_norm = math.inf\n" in text
    assert "from torchtitan.distributed.activation_checkpoint import SelectiveAC\n" in text
    assert "config.activation_checkpoint = SelectiveAC.Config()\n" in text
    text = recipe_text(exported("moe-ep"), [])  # no recompute, finite clipping
    assert "import math" not in text and "activation_checkpoint import" not in text
    assert "config.activation_checkpoint = None\n" in text  # written: torchtitan's default is selective
    assert "config.parallelism.module_fqns_per_model_part = None\n" in text
    text = recipe_text(exported("interleaved-uneven"), [])  # Muon: no optimizer, so no default_adamw
    assert "default_adamw" not in text and "config.optimizer" not in text
    assert "    config.parallelism.module_fqns_per_model_part = [\n        ['tok_embeddings', 'layers.0', " in text


def test_literals_read_back_as_the_values():
    for value in (1, 0.1, 1e-08, True, None, "1F1B", 'say "hi"\\', (0.9, 0.95), (1,), [["a", "b"], ["c"]], []):
        assert ast.literal_eval(literal(value)) == value and type(ast.literal_eval(literal(value))) is type(value)
    assert (literal(math.inf), literal(-math.inf), literal([math.inf])) == ("math.inf", "-math.inf", "[math.inf]")
    with pytest.raises(TypeError, match="no Python literal for"):
        literal({"a": 1})


def test_read_recipe_refuses_what_the_core_cannot_say():
    class MemoryBudgetAC:
        class Config:
            pass

    config = types.SimpleNamespace(activation_checkpoint=MemoryBudgetAC.Config())
    with pytest.raises(ValueError, match="has no core counterpart"):
        read_recipe(config, ["activation_checkpoint"])
    group = types.SimpleNamespace(pattern=r"\.bias$", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})
    config = types.SimpleNamespace(optimizer=types.SimpleNamespace(param_groups=[group]))
    with pytest.raises(ValueError, match="not one AdamW group over every parameter"):
        read_recipe(config, ["optimizer.lr"])
