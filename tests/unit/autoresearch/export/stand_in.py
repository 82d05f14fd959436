"""A stand-in for the few torchtitan names an exported recipe imports, so that tests run the recipe without
torchtitan: ``Trainer.Config()`` is an attribute tree that records every assignment, ``default_adamw`` and the
activation-checkpoint policies build objects of torchtitan's shape (``autoresearch.export.recipe.read_recipe``
reads them back as it reads the real ones)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

from autoresearch.export.recipe import read_recipe

RECIPE_MODULES = (
    "torchtitan",
    "torchtitan.trainer",
    "torchtitan.components",
    "torchtitan.components.optimizer",
    "torchtitan.distributed",
    "torchtitan.distributed.activation_checkpoint",
)


class Recorder(SimpleNamespace):
    """An attribute tree: reading an attribute never set gives a subtree; every assignment is logged under its
    dotted path (in ``log``, shared by the whole tree)."""

    def __init__(self, log: dict, prefix: str = ""):
        super().__init__()
        self.__dict__["_log"], self.__dict__["_prefix"] = log, prefix

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        child = Recorder(self._log, f"{self._prefix}{name}.")
        self.__dict__[name] = child
        return child

    def __setattr__(self, name, value):
        self._log[self._prefix + name] = value
        self.__dict__[name] = value


class SelectiveAC:
    class Config:
        pass


class FullAC:
    class Config:
        pass


def default_adamw(lr: float = 8e-4, **kwargs) -> SimpleNamespace:
    """torchtitan's shape: one catch-all AdamW group whose kwargs are the optimizer's."""
    group = SimpleNamespace(pattern=r".*", optimizer_name="AdamW", optimizer_kwargs={"lr": lr, **kwargs})
    return SimpleNamespace(param_groups=[group])


def modules(log: dict) -> dict[str, types.ModuleType]:
    """The stand-in modules; ``Trainer.Config()`` records into ``log``."""
    out = {name: types.ModuleType(name) for name in RECIPE_MODULES}
    out["torchtitan.trainer"].Trainer = SimpleNamespace(Config=lambda: Recorder(log))
    out["torchtitan.components.optimizer"].default_adamw = default_adamw
    ac = out["torchtitan.distributed.activation_checkpoint"]
    ac.SelectiveAC, ac.FullAC = SelectiveAC, FullAC
    return out


def run_recipe(text: str, monkeypatch) -> tuple[object, dict]:
    """Run a recipe's ``tuned()`` against the stand-in: (the config it returns, every assignment it made)."""
    log: dict = {}
    for name, module in modules(log).items():
        monkeypatch.setitem(sys.modules, name, module)
    namespace: dict = {"__name__": "tuned_recipe"}
    exec(compile(text, "tuned_recipe.py", "exec"), namespace)
    return namespace["tuned"](), log


def recipe_fields(text: str, monkeypatch) -> dict:
    """The fields a recipe's ``tuned()`` sets, as the target's flat keys (each optimizer kwarg its own), read back
    from the config it returns as ``read_recipe`` reads a loaded torchtitan config."""
    config, log = run_recipe(text, monkeypatch)
    paths = []
    for path in log:
        kwargs = config.optimizer.param_groups[0].optimizer_kwargs if path == "optimizer" else {}
        paths += [f"optimizer.{k}" for k in kwargs] or [path]
    return read_recipe(config, paths)
