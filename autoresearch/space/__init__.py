"""Search spaces: what a study may vary, under which constraints, toward which objective.

space.py       SearchSpace: the one model of a space file, and the object the agent works with
params.py      ChoiceParam, IntParam, FloatParam: one dimension each, a class per kind
baseline.py    the baseline a study runs first and states every result against
expr.py        the safe evaluator of constraints (never ``eval``)
file.py        load_space(name or path): the YAML, its lines, the space, checked against the core
core_check.py  a core.train space refused at load when the core would refuse its keys or values
schema.py      the strict pydantic base, and errors in the project's words (SpaceError: file, key, line)
"""

from autoresearch.space.core_check import check_against_core, check_trial_command
from autoresearch.space.expr import Expr, ExprError, parse
from autoresearch.space.file import SPACES_DIR, load_space, resolve_space_path
from autoresearch.space.params import ANNOTATIONS, PARAM_TYPES, ChoiceParam, FloatParam, IntParam, Param, ParamError
from autoresearch.space.schema import SpaceError
from autoresearch.space.space import CORE_COMMAND, OBJECTIVE_METRICS, SearchSpace

__all__ = [
    "ANNOTATIONS",
    "CORE_COMMAND",
    "OBJECTIVE_METRICS",
    "PARAM_TYPES",
    "SPACES_DIR",
    "ChoiceParam",
    "Expr",
    "ExprError",
    "FloatParam",
    "IntParam",
    "Param",
    "ParamError",
    "SearchSpace",
    "SpaceError",
    "check_against_core",
    "check_trial_command",
    "load_space",
    "parse",
    "resolve_space_path",
]
