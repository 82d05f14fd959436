"""How a value is spelled in a Hydra override (``key=value``), and how an override list is read back: the one
home of that spelling, for the core's CLI, the agent's trial commands, search spaces and exports.

    override("optim.lr", 0.001)            -> "optim.lr=0.001"
    override_value(overrides, "trial.dir")  -> the last value given for the key (Hydra: the last one wins)
    parse_overrides(["cluster.nodes=64"])   -> {"cluster.nodes": 64}, typed by Hydra's own grammar
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

# Hydra reads these words as non-strings; a string with one of these values must be quoted.
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf", "-inf", "+inf"}
_HYDRA_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-./+]*$")
NULLS = ("", "null", "None")  # what an override may write for "no value"


def scalar_text(v: Any) -> str:
    """A value as a person (and YAML) writes it: null, true, 0.001, adamw."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def format_value(v: Any) -> str:
    """A value as Hydra's override grammar parses it back exactly: floats by ``repr`` (shortest round-trip),
    booleans lower-case, None as ``null``, lists in brackets, strings quoted when they would otherwise read as
    something else."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if v is None or isinstance(v, (bool, int, float)):
        return scalar_text(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    if hasattr(v, "item") and not isinstance(v, str):  # a NumPy scalar
        return format_value(v.item())
    s = str(v)
    if _HYDRA_PLAIN.match(s) and s.lower() not in _HYDRA_WORDS:
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def override(key: str, value: Any) -> str:
    """``key=value`` with the value spelled for Hydra."""
    return f"{key}={format_value(value)}"


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The text of the last value given for ``key`` (``+key=`` and ``++key=`` included), or None."""
    value = None
    for item in overrides:
        k, sep, v = item.lstrip("+").partition("=")
        if sep and k == key:
            value = v
    return value


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``key -> value`` of ``key=value`` overrides, each value typed as Hydra's grammar reads it ("64" an int,
    "true" a bool, "null" None, "'64'" a string); the last one wins. Raises ValueError naming a malformed one."""
    # function-level: Hydra loads only where override text is read back, not in a worker's start-up
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser, out = OverridesParser.create(), {}
    for item in items:
        try:
            (parsed,) = parser.parse_overrides([item])
        except HydraException as exc:
            raise ValueError(f"{item!r} is not a key=value override: {str(exc).splitlines()[0]}") from exc
        out[parsed.key_or_group] = parsed.value()
    return out


def override_number(overrides: Sequence[str], key: str, default: float | None) -> float | None:
    """The number given for ``key``; ``default`` when it is not given, null or not a number."""
    text = override_value(overrides, key)
    try:
        return default if text is None or text in NULLS else float(text)
    except ValueError:
        return default
