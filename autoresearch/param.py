"""One dimension of a search space: a choice, an int range or a float range, and what it means to be a
valid, coerced, sampled, gridded or described value of it. See ``autoresearch.space`` for the YAML schema."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import Annotated, Any, Literal, Optional, Union

import numpy as np
from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, model_validator

from autoresearch.schema import FieldError, StrictModel, first_problem, kind

__all__ = ["Param", "ParamError", "ParamSpec", "PARAM_SPECS", "PARAM_TYPES", "ANNOTATIONS", "format_override_value",
           "scalar_text"]

PARAM_TYPES = ("choice", "int", "float")
ANNOTATIONS = ("up", "down", "none")


class ParamError(FieldError):
    """A param definition broken in one of its fields (``field``); the loader turns it into a SpaceError."""


def _is_int(v: Any) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _tidy(x: float) -> float:
    """Round a computed grid point to 12 significant digits: 0.0030000000000000005 -> 0.003, so that
    overrides, tables and duplicate checks see the number a person would write."""
    return float(f"{x:.12g}")


def scalar_text(v: Any) -> str:
    """A value as a person (and YAML) writes it: null, true, 0.001, adamw."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


# Hydra reads these words as non-strings; a string with one of these values must be quoted.
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf", "-inf", "+inf"}
_HYDRA_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-./+]*$")


def format_override_value(v: Any) -> str:
    """A value as Hydra's override grammar parses it back exactly: floats by ``repr`` (shortest round-trip),
    booleans lower-case, None as ``null``, strings quoted when they would otherwise read as something else."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if v is None or isinstance(v, (bool, int, float)):
        return scalar_text(v)
    if isinstance(v, np.generic):
        return format_override_value(v.item())
    s = str(v)
    if _HYDRA_PLAIN.match(s) and s.lower() not in _HYDRA_WORDS:
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ---------------------------------------------------------------------------------------------- the schema
# One pydantic model per param type: the keys it takes (any other is an error naming the allowed ones), their
# types, and the rules between them. The YAML loader validates each ``params`` entry with these, and ``Param``
# validates itself with them too, so a param built in code obeys the same rules.

def _annotation(value: Any) -> Any:
    if value is not None and not (isinstance(value, str) and value in ANNOTATIONS):
        raise ValueError(f"must be up, down or none (got {kind(value)}); omit it to mean 'must be equal when "
                         "comparing configs'")
    return value


def _choice_values(values: list) -> list:
    if not values:
        raise ValueError("a choice needs a non-empty list of values, e.g. values: [adamw, muon]")
    seen = set()
    for v in values:
        if not (v is None or isinstance(v, (str, bool, int, float))):
            raise ValueError(f"values must be scalars (string, number, bool, null), got {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"values must be finite, got {v!r}")
        key = (type(v).__name__ if isinstance(v, (bool, str)) or v is None else "number", v)
        if key in seen:
            raise ValueError(f"duplicate value {scalar_text(v)}; list each value once")
        seen.add(key)
    return values


def _spec_mapping(value: Any) -> Any:
    """Before the union picks a model by ``type``: say what a param entry is when it is not one."""
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping with a type (choice, int or float), got {kind(value)}; e.g. "
                         "{type: choice, values: [1, 2]}")
    if "type" not in value:
        raise ValueError(f"needs a type: {', '.join(PARAM_TYPES)}")
    return value


Annotation = Annotated[Optional[Any], AfterValidator(_annotation)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class ChoiceSpec(StrictModel):
    type: Literal["choice"]
    values: Annotated[list, AfterValidator(_choice_values)]
    memory: Annotation = None
    nan: Annotation = None
    description: str = ""


class _RangeSpec(StrictModel):
    """The keys of an int or a float range, in the order messages list them, and the rules they share; the
    subclasses narrow the types."""

    type: str
    low: FiniteFloat
    high: FiniteFloat
    step: Optional[FiniteFloat] = None
    log: bool = False
    memory: Annotation = None
    nan: Annotation = None
    description: str = ""

    @model_validator(mode="after")
    def _rules(self):
        if self.low >= self.high:
            raise FieldError("high", f"low must be below high (got low={self.low}, high={self.high}); use a choice "
                                     "or a fixed value for a single value")
        if self.log and self.low <= 0:
            raise FieldError("low", f"a log-scale param needs low > 0 (got {self.low})")
        if self.step is not None:
            if self.step <= 0:
                raise FieldError("step", f"must be > 0 (got {self.step})")
            self._check_step_with_log()
            k = (self.high - self.low) / self.step
            if abs(k - round(k)) > 1e-9 * max(1.0, k):
                raise FieldError("step", f"high - low = {self.high - self.low} is not a multiple of step {self.step}")
        return self

    def _check_step_with_log(self) -> None:
        raise NotImplementedError


class IntSpec(_RangeSpec):
    type: Literal["int"]
    low: int
    high: int
    step: int = 1

    def _check_step_with_log(self) -> None:
        if self.log and self.step != 1:
            raise FieldError("step", "a log-scale int param must have step 1 (Optuna samples it continuously)")


class FloatSpec(_RangeSpec):
    type: Literal["float"]

    def _check_step_with_log(self) -> None:
        if self.log:
            raise FieldError("step", "log and step cannot be combined for a float param; drop one")


PARAM_SPECS = {"choice": ChoiceSpec, "int": IntSpec, "float": FloatSpec}
# A ``params`` entry of a space file: the model is chosen by its ``type``.
ParamSpec = Annotated[Union[ChoiceSpec, IntSpec, FloatSpec], Field(discriminator="type"),
                      BeforeValidator(_spec_mapping)]


# ---------------------------------------------------------------------------------------------- Param

@dataclass
class Param:
    """One dimension of the space. Validated on construction by its type's model (ParamError names the broken
    field)."""

    name: str
    type: str                       # choice | int | float
    values: Optional[list] = None   # choice
    low: Optional[float] = None     # int / float, inclusive
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None    # int: default 1; float: optional grid spacing
    memory: Optional[str] = None    # up | down | none | None (unknown: must be equal)
    nan: Optional[str] = None       # up | down | none | None
    description: str = ""

    def __post_init__(self):
        if self.type not in PARAM_TYPES:
            raise ParamError("type", f"must be one of {', '.join(PARAM_TYPES)} (got {self.type!r})")
        # Only what was given: a default left alone is not "an unknown key" of the other types.
        given = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.name != "name" and not _is_default(getattr(self, f.name), f.default)}
        if isinstance(given.get("values"), tuple):
            given["values"] = list(given["values"])
        try:
            spec = PARAM_SPECS[self.type].model_validate({"type": self.type, **given})
        except ValidationError as exc:
            raise ParamError(*first_problem(exc)) from None
        for key, value in spec:
            setattr(self, key, value)

    @classmethod
    def from_spec(cls, name: str, spec: StrictModel) -> "Param":
        """The Param of a validated ``params`` entry of a space file."""
        return cls(name=name, **dict(spec))

    def spec(self) -> dict:
        """This param as the ``params`` entry of a space file."""
        return {k: getattr(self, k) for k in PARAM_SPECS[self.type].model_fields}

    # -- values -------------------------------------------------------------------------------------------

    def index(self, value: Any) -> int:
        """Position of ``value`` in a choice's values, matching types strictly (True is not 1, 2.0 is not
        the int 2); -1 when absent."""
        for i, v in enumerate(self.values or ()):
            if _same_choice(v, value):
                return i
        return -1

    def problem(self, value: Any) -> Optional[str]:
        """Why ``value`` is not a valid value of this param, or None."""
        shown = f"{self.name}={value!r}"
        if self.type == "choice":
            if self.index(value) < 0:
                return f"{shown}: not one of {', '.join(scalar_text(v) for v in self.values)}"
            return None
        if self.type == "int" and not _is_int(value):
            return f"{shown}: must be an integer"
        if self.type == "float" and not (_is_number(value) and math.isfinite(value)):
            return f"{shown}: must be a finite number"
        if value < self.low:
            return f"{shown}: below the minimum {self.low}"
        if value > self.high:
            return f"{shown}: above the maximum {self.high}"
        if self.step is not None and not (self.type == "int" and self.step == 1):
            k = (value - self.low) / self.step
            if abs(k - round(k)) > 1e-9 * max(1.0, abs(k)):
                return f"{shown}: not on the grid {self.low} + k * {self.step}"
        return None

    def coerce(self, value: Any) -> Any:
        """Turn a near miss into this param's type ("4" -> 4, 4.0 -> 4 for an int, "true" -> True for a
        choice of booleans); raises ValueError with a clear reason. Range is left to ``problem``."""
        if isinstance(value, np.generic):
            value = value.item()
        if self.type == "choice":
            return self._coerce_choice(value)
        if isinstance(value, bool) or value is None:
            raise ValueError(f"{self.name}: {value!r} is not a number")
        if isinstance(value, str):
            try:
                value = float(value.strip()) if self.type == "float" else _parse_int_text(value)
            except ValueError:
                raise ValueError(f"{self.name}: {value!r} is not {'an integer' if self.type == 'int' else 'a number'}")
        if not _is_number(value) or not math.isfinite(value):
            raise ValueError(f"{self.name}: {value!r} is not a finite number")
        if self.type == "float":
            return float(value)
        if float(value) != int(value):
            raise ValueError(f"{self.name}: {value!r} is not an integer")
        return int(value)

    def _coerce_choice(self, value: Any) -> Any:
        i = self.index(value)
        if i >= 0:
            return self.values[i]
        for v in self.values:
            # A number of the other kind (2.0 for 2), or the text of a value ("2", "true", "null").
            if _is_number(v) and _is_number(value) and v == value:
                return v
            if isinstance(value, str) and value.strip().lower() in {scalar_text(v).lower(), str(v).lower()}:
                return v
            if isinstance(value, str) and _is_number(v):
                try:
                    if float(value) == v:
                        return v
                except ValueError:
                    pass
        raise ValueError(f"{self.name}: {value!r} is not one of {', '.join(scalar_text(v) for v in self.values)}")

    def order(self, value: Any) -> float:
        """A number that grows with the value along this param's axis: the index for a choice."""
        return float(self.index(value)) if self.type == "choice" else float(value)

    # -- distributions, grids, samples ----------------------------------------------------------------------

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.type == "choice":
            return CategoricalDistribution(self.values)
        if self.type == "int":
            return IntDistribution(self.low, self.high, log=self.log, step=self.step)
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def grid_values(self, points_per_float: int = 4, max_points_per_int: int = 16) -> list:
        """Grid points: every choice; every int on its step grid (or ``max_points_per_int`` spread over it,
        log-spaced when log); ``points_per_float`` floats (log-spaced when log, snapped to ``step``)."""
        if self.type == "choice":
            return list(self.values)
        if self.type == "int":
            every = list(range(self.low, self.high + 1, self.step))
            if len(every) <= max_points_per_int:
                return every
            raw = self._spread(max_points_per_int)
            return _dedupe(self.low + self.step * round((x - self.low) / self.step) for x in raw)
        if self.step is not None:
            k = round((self.high - self.low) / self.step)
            idx = range(k + 1) if k + 1 <= points_per_float else np.linspace(0, k, points_per_float)
            return _dedupe(_tidy(self.low + self.step * round(float(i))) for i in idx)
        return _dedupe(min(self.high, max(self.low, _tidy(x))) for x in self._spread(points_per_float))

    def _spread(self, n: int) -> list[float]:
        if n < 1:
            raise ValueError("need at least one grid point per param")
        if n == 1:
            return [math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2]
        pts = np.geomspace(self.low, self.high, n) if self.log else np.linspace(self.low, self.high, n)
        return [float(x) for x in pts]

    def sample(self, rng: np.random.Generator) -> Any:
        if self.type == "choice":
            return self.values[int(rng.integers(len(self.values)))]
        if self.type == "int":
            if self.log:
                # Uniform in log space over [low - 0.5, high + 0.5) so the end points get their share
                # after rounding (log needs low >= 1 for an int, so low - 0.5 > 0).
                x = math.exp(rng.uniform(math.log(self.low - 0.5), math.log(self.high + 0.5)))
                return int(min(self.high, max(self.low, round(x))))
            return self.low + self.step * int(rng.integers((self.high - self.low) // self.step + 1))
        if self.step is not None:
            return _tidy(self.low + self.step * int(rng.integers(round((self.high - self.low) / self.step) + 1)))
        if self.log:
            return float(min(self.high, math.exp(rng.uniform(math.log(self.low), math.log(self.high)))))
        return float(rng.uniform(self.low, self.high))

    # -- text -----------------------------------------------------------------------------------------------

    def json_schema(self) -> dict:
        if self.type == "choice":
            schema: dict = {"enum": list(self.values)}
            kinds = {_json_type(v) for v in self.values}
            if len(kinds) == 1:
                schema["type"] = kinds.pop()
        else:
            schema = {"type": "integer" if self.type == "int" else "number",
                      "minimum": self.low, "maximum": self.high}
            if self.type == "int" and self.step > 1 and self.low % self.step == 0:
                schema["multipleOf"] = self.step
        schema["description"] = self.describe()
        return schema

    def describe(self) -> str:
        if self.type == "choice":
            text = f"one of [{', '.join(scalar_text(v) for v in self.values)}]"
        else:
            text = f"{self.type} in [{scalar_text(self.low)}, {scalar_text(self.high)}]"
            if self.log:
                text += " log-scale"
            if self.step is not None and (self.type == "float" or self.step != 1):
                text += f" step {scalar_text(self.step)}"
        notes = [f"{k}: {getattr(self, k)}" for k in ("memory", "nan") if getattr(self, k) in ("up", "down")]
        if notes:
            text += f" ({'; '.join(notes)})"
        if self.description:
            text += f" — {self.description}"
        return text


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def _same_choice(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return _is_int(a) == _is_int(b) and a == b


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    return "number" if isinstance(v, float) else "string"


def _parse_int_text(text: str) -> int:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        x = float(text)           # "4.0" or "4e0": fine when integral; the caller checks
        if not math.isfinite(x) or x != int(x):
            raise
        return int(x)


def _dedupe(values) -> list:
    out: list = []
    for v in values:
        if v not in out:
            out.append(v)
    return out
