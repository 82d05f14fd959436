"""The base of the space's declarative models (pydantic 2) and their errors in the project's words.

A search space is validated by pydantic models (``autoresearch.space.params``: one param;
``autoresearch.space.space``: the whole file). Pydantic reports errors as ``loc`` tuples and its own sentences; people
editing a YAML file need the dotted key they wrote, what is wrong with the value they wrote, and what to write
instead. ``first_problem`` turns a ``ValidationError`` into that (key, reason) pair; the caller adds the file and the
line.

Validators that judge one field by another (``low < high``) raise ``FieldError`` naming the field to blame,
since pydantic would otherwise blame the whole model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

__all__ = ["FieldError", "Lines", "SpaceError", "StrictModel", "first_problem", "kind"]


class SpaceError(ValueError):
    """A search space that cannot be used. ``file``, ``key`` (dotted, e.g. ``params.optim.lr.low``) and
    ``reason`` say where and why; ``line`` is the 1-based line in the file when known."""

    def __init__(self, file: str, key: str, reason: str, *, line: int | None = None):
        self.file, self.key, self.reason, self.line = str(file), key, reason, line
        where = f" (line {line})" if line else ""
        super().__init__(f"{self.file}: {key}: {reason}{where}")


class Lines(dict):
    """Dotted key path ("params.optim.lr.low", "constraints[0]") -> its 1-based line in the file."""

    def of(self, key: str) -> int | None:
        """The line of ``key``, or of its closest enclosing key that has one."""
        while key:
            if key in self:
                return self[key]
            cut = max(key.rfind("."), key.rfind("["))
            key = key[:cut] if cut > 0 else ""
        return None


class FieldError(ValueError):
    """Raised inside a validator: ``field`` (a dotted key relative to the model) is wrong, for ``reason``."""

    def __init__(self, field_name: str, reason: str):
        self.field = field_name
        super().__init__(reason)


def kind(value: Any) -> str:
    """A value as the error message shows it: its type and repr ("float 2.5", "str 'small'", "null")."""
    return "null" if value is None else f"{type(value).__name__} {value!r}"


class _InProjectWords(type(BaseModel)):
    """A model built in code (``Model(...)``) raises its own error (``_error_from``: a SpaceError or ParamError that
    names the key), as a file read by the loader does; validation from data (``model_validate``) does not come
    through here and leaves the error to its caller, who knows the file and the lines."""

    def __call__(cls, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as exc:
            raise cls._error_from(exc, kwargs) from None


class StrictModel(BaseModel, metaclass=_InProjectWords):
    """No unknown keys, no silent conversions (``2.5`` is not an int, ``"4"`` not a number, ``1`` not true);
    an int is accepted where a float is expected. An unknown key is reported with the keys allowed there."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def _error_from(cls, exc: ValidationError, data: dict) -> Exception:
        """The error a model built in code with ``data`` raises for ``exc``: pydantic's own, unless overridden."""
        return exc

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if not isinstance(key, str):
                    raise FieldError("", f"keys must be strings (got {kind(key)})")
                if key not in cls.model_fields:
                    raise FieldError(key, f"unknown key; allowed: {', '.join(cls.allowed_keys())}")
        return data

    @classmethod
    def allowed_keys(cls) -> list[str]:
        """The keys a file may give, in the order an error lists them."""
        return list(cls.model_fields)


def _expected(ctx: dict) -> str:
    return str(ctx.get("expected", "")).replace("'", "")


def _mapping(v: Any, c: dict) -> str:
    return f"must be a mapping (got {kind(v)}); write key: value lines under it"


def _integer(v: Any, c: dict) -> str:
    return f"must be an integer (got {kind(v)})"


# pydantic error type -> the reason, from the error's input and context. Each says what to write instead.
_REASONS = {
    "missing": lambda v, c: "is required",
    "int_type": _integer,
    "int_from_float": _integer,
    "float_type": lambda v, c: f"must be a finite number (got {kind(v)})",
    "finite_number": lambda v, c: f"must be a finite number (got {v!r})",
    "bool_type": lambda v, c: f"must be true or false (got {kind(v)})",
    "string_type": lambda v, c: f"must be a string (got {kind(v)}); quote it if YAML reads it as something else",
    "list_type": lambda v, c: f"must be a list (got {kind(v)}); write [a, b] or one '- item' per line",
    "dict_type": _mapping,
    "model_type": _mapping,
    "model_attributes_type": _mapping,
    "greater_than": lambda v, c: f"must be > {c['gt']} (got {v})",
    "greater_than_equal": lambda v, c: f"must be >= {c['ge']} (got {v})",
    "literal_error": lambda v, c: f"must be {_expected(c)} (got {kind(v)})",
    "union_tag_invalid": lambda v, c: (
        f"must be one of {_expected({'expected': c['expected_tags']})} (got {c['tag']!r})"
    ),
}


def first_problem(
    exc: ValidationError, order: Callable[[str], Any] | None = None, loc_filter: Callable[[list], list] | None = None
) -> tuple[str, str]:
    """The (dotted key, reason) of the error to show first: the one ``order(key)`` ranks lowest (e.g. its line in
    the file), else pydantic's first. Keys read like the YAML: ``params.optim.lr.low``, ``constraints[0]``.
    ``loc_filter`` drops what pydantic adds to a location that the file does not have (a union's tag)."""
    problems = [_problem(e, loc_filter) for e in exc.errors()]
    if order is not None:
        problems.sort(key=lambda p: (order(p[0]) is None, order(p[0]) or 0))
    return problems[0]


def _problem(error: dict, loc_filter: Callable[[list], list] | None) -> tuple[str, str]:
    loc, ctx, value, kind_ = list(error["loc"]), error.get("ctx") or {}, error.get("input"), error["type"]
    loc = [part for part in loc if part != "[key]"]  # a dict key's own error: blame the key
    if loc_filter is not None:
        loc = loc_filter(loc)
    if kind_ == "union_tag_invalid":
        loc.append(str(ctx.get("discriminator", "")).strip("'"))
    cause = ctx.get("error")
    if isinstance(cause, FieldError):
        if cause.field:
            loc.append(cause.field)
        return _key(loc), str(cause)
    if kind_ == "union_tag_not_found":
        tag = str(ctx.get("discriminator", "")).strip("'")
        return _key(loc), f"needs a {tag} (got {kind(value)})"
    if kind_ == "value_error" and cause is not None:
        return _key(loc), str(cause)
    reason = _REASONS.get(kind_)
    return _key(loc), reason(value, ctx) if reason else f"{error['msg']} (got {kind(value)})"


def _key(loc: list) -> str:
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif part != "":
            key += f".{part}" if key else str(part)
    return key
