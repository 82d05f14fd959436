"""One dimension of a search space: a choice, an int range or a float range. Each kind is one pydantic model,
which is both the ``params`` entry of a space file (its keys, their types, the rules between them) and the object
the agent works with (what a valid value is, how to coerce, sample, grid, encode and describe one). No kind
switches on a type field: each class says what its values are.

    ChoiceParam   values: [adamw, muon]                      (a value's position orders the choice)
    IntParam      low, high, step (default 1), log
    FloatParam    low, high, step (optional grid), log

``memory`` and ``nan`` annotate how a param pushes a failure (``search.feasibility``): up, down or none; absent
means "unknown: compare only configs where it is equal". A param's ``name`` is the key it stands under in its
space, which sets it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr, ValidationError, model_validator

from autoresearch.records import tidy, value_key
from autoresearch.space.schema import FieldError, StrictModel, first_problem, kind
from core.config import scalar_text

PARAM_TYPES = ("choice", "int", "float")
ANNOTATIONS = ("up", "down", "none")


class ParamError(FieldError):
    """A param definition broken in one of its fields (``field``); the loader turns it into a SpaceError."""


def _is_int(v: Any) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _annotation(value: Any) -> Any:
    if value is not None and not (isinstance(value, str) and value in ANNOTATIONS):
        raise ValueError(
            f"must be up, down or none (got {kind(value)}); omit it to mean 'must be equal when comparing configs'"
        )
    return value


Annotation = Annotated[Any | None, AfterValidator(_annotation)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Escape = Callable[[str, Any], bool]  # (param name, value) -> whether a way out there is a point the space allows


class _Param(StrictModel):
    """What every kind has: the failure annotations, a description, and the name its space gives it."""

    type: str
    memory: Annotation = None
    nan: Annotation = None
    description: str = ""
    discrete: ClassVar[bool] = True  # finitely many values (a choice, an int range); a float range is not
    _name: str = PrivateAttr(default="")

    @classmethod
    def _error_from(cls, exc: ValidationError, data: dict) -> Exception:
        """Built in code, a param obeys the same rules as in a file: ParamError names the broken field."""
        return ParamError(*first_problem(exc))

    @property
    def name(self) -> str:
        return self._name

    @classmethod
    def allowed_keys(cls) -> list[str]:
        """The keys of this kind's entry in a space file: its type, its own keys, then the annotations."""
        common = ["memory", "nan", "description"]
        return [k for k in cls.model_fields if k not in common] + common

    def spec(self) -> dict:
        """This param as the ``params`` entry of a space file."""
        return self.model_dump()

    def _shown(self, value: Any) -> str:
        return f"{self.name}={value!r}"

    def annotations_text(self) -> str:
        notes = [f"{k}: {getattr(self, k)}" for k in ("memory", "nan") if getattr(self, k) in ("up", "down")]
        text = f" ({'; '.join(notes)})" if notes else ""
        return text + (f" — {self.description}" if self.description else "")


class ChoiceParam(_Param):
    type: Literal["choice"] = "choice"
    values: list

    @model_validator(mode="after")
    def _distinct_scalars(self):
        if not self.values:
            raise FieldError("values", "a choice needs a non-empty list of values, e.g. values: [adamw, muon]")
        seen = set()
        for v in self.values:
            if not (v is None or isinstance(v, (str, bool, int, float))):
                raise FieldError("values", f"values must be scalars (string, number, bool, null), got {v!r}")
            if isinstance(v, float) and not math.isfinite(v):
                raise FieldError("values", f"values must be finite, got {v!r}")
            key = (type(v).__name__ if isinstance(v, (bool, str)) or v is None else "number", v)
            if key in seen:
                raise FieldError("values", f"duplicate value {scalar_text(v)}; list each value once")
            seen.add(key)
        return self

    def index(self, value: Any) -> int:
        """Position of ``value`` in the values, matching types strictly (True is not 1, 2.0 is not the int 2); -1
        when absent."""
        for i, v in enumerate(self.values):
            if _same_choice(v, value):
                return i
        return -1

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a valid value of this param, or None."""
        if self.index(value) < 0:
            return f"{self._shown(value)}: not one of {', '.join(scalar_text(v) for v in self.values)}"
        return None

    def coerce(self, value: Any) -> Any:
        """A near miss as one of the values: the other kind of number (2.0 for 2), or a value's text ("2", "true",
        "null"); ValueError otherwise."""
        if isinstance(value, np.generic):
            value = value.item()
        i = self.index(value)
        if i >= 0:
            return self.values[i]
        for v in self.values:
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

    def position(self, value: Any) -> float | None:
        """Where ``value`` sits along this param's axis: its index (a later value is "up"); None when absent."""
        i = self.index(value)
        return float(i) if i >= 0 else None

    def escape(self, failed: Any, direction: str, valid: Escape) -> str:
        """The values that leave the region a failure at ``failed`` dominates in ``direction``, e.g. "memory.recompute
        in [full]" (only values ``valid`` allows); "" when there is no room."""
        i = self.index(failed)
        room = [v for v in (self.values[:i] if direction == "up" else self.values[i + 1 :]) if valid(self.name, v)]
        return f"{self.name} in [{', '.join(scalar_text(v) for v in room)}]" if room else ""

    def extremes(self) -> list[tuple[str, Any]]:
        """(where in the file, value) of the values a check of the whole range must try: every choice."""
        return [(f"values[{i}]", v) for i, v in enumerate(self.values)]

    def distribution(self):
        return CategoricalDistribution(self.values)

    def grid_values(self, points_per_float: int = 4, max_points_per_int: int = 16) -> list:
        return list(self.values)

    def sample(self, rng: np.random.Generator) -> Any:
        return self.values[int(rng.integers(len(self.values)))]

    def encode(self, value: Any) -> list[float]:
        """Features in [0, 1] for a surrogate model: numbers and booleans are ordered (one feature, the index
        scaled), other values one-hot."""
        if all(isinstance(c, (int, float)) for c in self.values):
            return [self.index(value) / max(1, len(self.values) - 1)]
        return [float(i == self.index(value)) for i in range(len(self.values))]

    def json_schema(self) -> dict:
        schema: dict = {"enum": list(self.values)}
        kinds = {_json_type(v) for v in self.values}
        if len(kinds) == 1:
            schema["type"] = kinds.pop()
        return {**schema, "description": self.describe()}

    def describe(self) -> str:
        return f"one of [{', '.join(scalar_text(v) for v in self.values)}]" + self.annotations_text()


class _RangeParam(_Param):
    """What an int range and a float range share: inclusive bounds, an optional step grid, a log scale."""

    low: FiniteFloat
    high: FiniteFloat
    step: FiniteFloat | None = None
    log: bool = False

    @model_validator(mode="after")
    def _bounds(self):
        if self.low >= self.high:
            raise FieldError(
                "high",
                f"low must be below high (got low={self.low}, high={self.high}); use a choice "
                "or a fixed value for a single value",
            )
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

    def _type_problem(self, value: Any) -> str | None:
        raise NotImplementedError

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a valid value of this param, or None."""
        shown = self._shown(value)
        wrong = self._type_problem(value)
        if wrong:
            return f"{shown}: {wrong}"
        if value < self.low:
            return f"{shown}: below the minimum {self.low}"
        if value > self.high:
            return f"{shown}: above the maximum {self.high}"
        if self.step is not None and not self._unit_step:
            k = (value - self.low) / self.step
            if abs(k - round(k)) > 1e-9 * max(1.0, abs(k)):
                return f"{shown}: not on the grid {self.low} + k * {self.step}"
        return None

    @property
    def _unit_step(self) -> bool:
        return False

    def _number(self, value: Any) -> float:
        """A near miss as a finite number (NumPy scalars, numbers' text); ValueError otherwise."""
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bool) or value is None:
            raise ValueError(f"{self.name}: {value!r} is not a number")
        if isinstance(value, str):
            value = self._parse(value)
        if not _is_number(value) or not math.isfinite(value):
            raise ValueError(f"{self.name}: {value!r} is not a finite number")
        return value

    def _parse(self, text: str) -> float:
        raise NotImplementedError

    def position(self, value: Any) -> float | None:
        """Where ``value`` sits along this param's axis (the number itself); None when it is not a number."""
        return value_key(value)[1] if _is_number(value) else None

    def escape(self, failed: Any, direction: str, valid: Escape) -> str:
        """How to leave the region a failure at ``failed`` dominates in ``direction``, e.g.
        "training.micro_batch_size < 8"; "" when the failure sits at the edge."""
        if failed == (self.low if direction == "up" else self.high):
            return ""
        return f"{self.name} {'<' if direction == 'up' else '>'} {scalar_text(failed)}"

    def extremes(self) -> list[tuple[str, Any]]:
        """(where in the file, value) of the values a check of the whole range must try: the two bounds."""
        return [("low", self.low), ("high", self.high)]

    def _spread(self, n: int) -> list[float]:
        if n < 1:
            raise ValueError("need at least one grid point per param")
        if n == 1:
            return [math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2]
        pts = np.geomspace(self.low, self.high, n) if self.log else np.linspace(self.low, self.high, n)
        return [float(x) for x in pts]

    def encode(self, value: Any) -> list[float]:
        """One feature in [0, 1]: the value's place between the bounds (in log space for a log param)."""
        lo, hi, x = (
            (math.log(self.low), math.log(self.high), math.log(value)) if self.log else (self.low, self.high, value)
        )
        return [(x - lo) / (hi - lo)]

    def describe(self) -> str:
        text = f"{self.type} in [{scalar_text(self.low)}, {scalar_text(self.high)}]"
        if self.log:
            text += " log-scale"
        if self.step is not None and not self._unit_step:
            text += f" step {scalar_text(self.step)}"
        return text + self.annotations_text()


class IntParam(_RangeParam):
    type: Literal["int"] = "int"
    low: int
    high: int
    step: int = 1

    def _check_step_with_log(self) -> None:
        if self.log and self.step != 1:
            raise FieldError("step", "a log-scale int param must have step 1 (Optuna samples it continuously)")

    @property
    def _unit_step(self) -> bool:
        return self.step == 1

    def _type_problem(self, value: Any) -> str | None:
        return None if _is_int(value) else "must be an integer"

    def _parse(self, text: str) -> float:
        try:
            return int(text.strip())
        except ValueError:
            pass
        try:
            x = float(text.strip())  # "4.0" or "4e0": fine when integral
        except ValueError:
            x = math.nan
        if not math.isfinite(x) or x != int(x):
            raise ValueError(f"{self.name}: {text!r} is not an integer")
        return x

    def coerce(self, value: Any) -> int:
        """A near miss as an int ("4" -> 4, 4.0 -> 4); ValueError otherwise. The range is ``problem``'s."""
        number = self._number(value)
        if float(number) != int(number):
            raise ValueError(f"{self.name}: {value!r} is not an integer")
        return int(number)

    def distribution(self):
        return IntDistribution(self.low, self.high, log=self.log, step=self.step)

    def grid_values(self, points_per_float: int = 4, max_points_per_int: int = 16) -> list:
        """Every int on the step grid, or ``max_points_per_int`` spread over it (log-spaced when log)."""
        every = list(range(self.low, self.high + 1, self.step))
        if len(every) <= max_points_per_int:
            return every
        return _dedupe(
            self.low + self.step * round((x - self.low) / self.step) for x in self._spread(max_points_per_int)
        )

    def sample(self, rng: np.random.Generator) -> int:
        if self.log:
            # Uniform in log space over [low - 0.5, high + 0.5) so the end points get their share after rounding
            # (log needs low >= 1 for an int, so low - 0.5 > 0).
            x = math.exp(rng.uniform(math.log(self.low - 0.5), math.log(self.high + 0.5)))
            return int(min(self.high, max(self.low, round(x))))
        return self.low + self.step * int(rng.integers((self.high - self.low) // self.step + 1))

    def json_schema(self) -> dict:
        schema = {"type": "integer", "minimum": self.low, "maximum": self.high}
        if self.step > 1 and self.low % self.step == 0:
            schema["multipleOf"] = self.step
        return {**schema, "description": self.describe()}


class FloatParam(_RangeParam):
    type: Literal["float"] = "float"
    discrete: ClassVar[bool] = False

    def _check_step_with_log(self) -> None:
        if self.log:
            raise FieldError("step", "log and step cannot be combined for a float param; drop one")

    def _type_problem(self, value: Any) -> str | None:
        return None if _is_number(value) and math.isfinite(value) else "must be a finite number"

    def _parse(self, text: str) -> float:
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError(f"{self.name}: {text!r} is not a number") from None

    def coerce(self, value: Any) -> float:
        """A near miss as a float ("0.1" -> 0.1, 1 -> 1.0); ValueError otherwise. The range is ``problem``'s."""
        return float(self._number(value))

    def distribution(self):
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def grid_values(self, points_per_float: int = 4, max_points_per_int: int = 16) -> list:
        """``points_per_float`` points (log-spaced when log, snapped to ``step``)."""
        if self.step is not None:
            k = round((self.high - self.low) / self.step)
            idx = range(k + 1) if k + 1 <= points_per_float else np.linspace(0, k, points_per_float)
            return _dedupe(tidy(self.low + self.step * round(float(i))) for i in idx)
        return _dedupe(min(self.high, max(self.low, tidy(x))) for x in self._spread(points_per_float))

    def sample(self, rng: np.random.Generator) -> float:
        if self.step is not None:
            return tidy(self.low + self.step * int(rng.integers(round((self.high - self.low) / self.step) + 1)))
        if self.log:
            return float(min(self.high, math.exp(rng.uniform(math.log(self.low), math.log(self.high)))))
        return float(rng.uniform(self.low, self.high))

    def json_schema(self) -> dict:
        return {"type": "number", "minimum": self.low, "maximum": self.high, "description": self.describe()}


def _spec_mapping(value: Any) -> Any:
    """Before the union picks a model by ``type``: say what a param entry is when it is not one."""
    if isinstance(value, _Param):
        return value
    if not isinstance(value, dict):
        raise ValueError(
            f"must be a mapping with a type (choice, int or float), got {kind(value)}; e.g. "
            "{type: choice, values: [1, 2]}"
        )
    if "type" not in value:
        raise ValueError(f"needs a type: {', '.join(PARAM_TYPES)}")
    return value


# A ``params`` entry of a space file, and a param of a SearchSpace: the model is chosen by its ``type``.
Param = Annotated[ChoiceParam | IntParam | FloatParam, Field(discriminator="type"), BeforeValidator(_spec_mapping)]


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


def _dedupe(values) -> list:
    out: list = []
    for v in values:
        if v not in out:
            out.append(v)
    return out
