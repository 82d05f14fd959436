"""A small, safe expression language for search-space constraints, on the standard library's ``ast``.

Constraints in ``search_spaces/*.yaml`` are written by people (and read by the agent), e.g.::

    parallel.dp_replicate * parallel.tp == world_size
    training.global_batch_size % (training.micro_batch_size * parallel.dp_replicate) == 0

A space file is data, so its text is never handed to ``eval``/``exec``/``compile``: ``ast.parse(mode="eval")``
only builds the syntax tree, every node of which must be of a whitelisted type (anything else is rejected with
what is not allowed and where), and this module evaluates that tree itself (turned once into one small closure
per node, which the grid's tens of thousands of evaluations need).

The language (Python's syntax and precedence, a subset of it):

- numbers (``4``, ``0.5``, ``1e-3``; no ``0x10``, ``1_000`` or ``1j``), ``true``/``false`` (``True``/``False``
  too), strings in ``'...'`` or ``"..."`` without quotes or backslashes inside (a choice's value: ``'interleaved'``);
- names, dotted like config keys (``parallel.tp``), never starting with ``__``;
- ``+ - * / // %``, unary ``-``/``+``, parentheses, comparisons ``== != < <= > >=`` chained like Python
  (``1 <= x < 4``), ``and``/``or``/``not``, and calls of ``min(...)``/``max(...)`` with positional arguments.

Arithmetic and ordering need numbers (a bool is not one); strings compare with ``==`` and ``!=`` only.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from numbers import Real
from typing import Any

__all__ = ["ExprError", "Expr", "parse"]


class ExprError(ValueError):
    """A constraint that does not parse, or cannot be evaluated on the given values."""


_BINARY: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
}
_COMPARE: dict[type, tuple[str, Callable[[Any, Any], bool]]] = {
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max}
_BOOLEANS = {"true": True, "false": False}
# Python operators and statements people are likely to try, with what to write instead.
_REJECTED_NODES: dict[type, str] = {
    ast.Pow: "'**' is not allowed",
    ast.BitAnd: "use 'and' instead of '&'",
    ast.BitOr: "use 'or' instead of '|'",
    ast.BitXor: "'^' is not allowed",
    ast.Invert: "'~' is not allowed",
    ast.MatMult: "'@' is not allowed",
    ast.LShift: "'<<' is not allowed",
    ast.RShift: "'>>' is not allowed",
    ast.Is: "'is' is not allowed (use ==)",
    ast.IsNot: "'is not' is not allowed (use !=)",
    ast.In: "'in' is not allowed",
    ast.NotIn: "'not in' is not allowed",
    ast.Lambda: "'lambda' is not allowed",
    ast.IfExp: "'if' is not allowed (combine conditions with and/or)",
    ast.Subscript: "subscripts are not allowed",
    ast.List: "lists are not allowed",
    ast.Tuple: "tuples are not allowed",
    ast.Dict: "dicts are not allowed",
    ast.Set: "sets are not allowed",
    ast.JoinedStr: "f-strings are not allowed",
    ast.NamedExpr: "':=' is not allowed",
    ast.Starred: "'*' unpacking is not allowed",
    ast.ListComp: "comprehensions are not allowed",
    ast.SetComp: "comprehensions are not allowed",
    ast.DictComp: "comprehensions are not allowed",
    ast.GeneratorExp: "comprehensions are not allowed",
    ast.Await: "'await' is not allowed",
    ast.Yield: "'yield' is not allowed",
    ast.YieldFrom: "'yield' is not allowed",
}
# What a syntax error at a character most likely means.
_REJECTED_CHARS = {
    "=": "assignment is not allowed (use == to compare)",
    "!": "use 'not' instead of '!'",
    "&": "use 'and' instead of '&'",
    "|": "use 'or' instead of '|'",
    ":": "':' is not allowed (no lambdas, slices or dicts)",
    "[": "subscripts and lists are not allowed",
    "{": "dicts and sets are not allowed",
}
_NUMBER_TEXT = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_STRING_TEXT = re.compile(r"'[^'\"\\]*'|\"[^'\"\\]*\"")


def _is_number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _number(op: str, v: Any) -> Any:
    """``v`` when it is a number (a bool is not), else ExprError naming the operator."""
    if type(v) is int or type(v) is float or _is_number(v):  # the exact types first: isinstance(Real) is slow
        return v
    raise ExprError(f"'{op}' needs numbers, got {v!r}")


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` (an Attribute chain ending in a Name) as the text "a.b.c"; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


class _Checker:
    """Walks a parsed tree once: rejects every node type outside the language and collects the names.
    ``indent`` is how many leading spaces were cut before parsing, so that columns count in the original text."""

    def __init__(self, text: str, indent: int):
        self.text, self.indent = text, indent
        self.names: set[str] = set()

    def fail(self, node: ast.AST, reason: str) -> ExprError:
        return ExprError(f"{reason} (at column {getattr(node, 'col_offset', 0) + 1 + self.indent})")

    def source(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ""

    def visit(self, node: ast.AST) -> None:
        if type(node) in _REJECTED_NODES:
            raise self.fail(node, _REJECTED_NODES[type(node)])
        if isinstance(node, (ast.Name, ast.Attribute)):
            self.name(node)
        elif isinstance(node, ast.Constant):
            self.constant(node)
        elif isinstance(node, ast.UnaryOp):
            self.operator(node, node.op, (ast.Not, ast.USub, ast.UAdd))
            self.visit(node.operand)
        elif isinstance(node, ast.BinOp):
            self.operator(node, node.op, tuple(_BINARY))
            self.visit(node.left)
            self.visit(node.right)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self.visit(value)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                self.operator(node, op, tuple(_COMPARE))
            for operand in (node.left, *node.comparators):
                self.visit(operand)
        elif isinstance(node, ast.Call):
            self.call(node)
        else:
            raise self.fail(
                node, f"{type(node).__name__} is not allowed; only arithmetic, comparisons, and/or/not and min/max"
            )

    def operator(self, node: ast.AST, op: ast.AST, allowed: tuple) -> None:
        if not isinstance(op, allowed):
            raise self.fail(node, _REJECTED_NODES.get(type(op), f"{type(op).__name__} is not allowed"))

    def name(self, node: ast.AST) -> str:
        name = _dotted(node)
        if name is None:
            raise self.fail(node, f"{self.source(node)!r} is not allowed: only dotted names such as parallel.tp")
        if any(part.startswith("__") for part in name.split(".")):
            raise self.fail(node, f"{name!r} is not allowed: names starting with '__' are reserved")
        if name not in _BOOLEANS:
            self.names.add(name)
        return name

    def constant(self, node: ast.Constant) -> None:
        text, value = self.source(node), node.value
        if isinstance(value, str):
            if not _STRING_TEXT.fullmatch(text):
                raise self.fail(
                    node,
                    f"{text} is not allowed: a string is a plain value in '...' or \"...\" with "
                    "no quotes, backslashes or prefixes inside",
                )
        elif _is_number(value):
            if not _NUMBER_TEXT.fullmatch(text):
                raise self.fail(node, f"malformed number {text!r}: write digits, a decimal point and an exponent only")
        elif not isinstance(value, bool):
            raise self.fail(node, f"{text} is not allowed; only numbers, strings, true and false")

    def call(self, node: ast.Call) -> None:
        func = _dotted(node.func)
        if func is not None and any(part.startswith("__") for part in func.split(".")):
            raise self.fail(node, f"{func!r} is not allowed: names starting with '__' are reserved")
        if func not in _FUNCTIONS:
            what = f"{func}()" if func else f"the result of {self.source(node.func)!r}"
            raise self.fail(node, f"calling {what} is not allowed; only min() and max() may be called")
        if node.keywords or not node.args:
            raise self.fail(node, f"{func}() takes one or more positional arguments")
        for arg in node.args:
            self.visit(arg)


def _syntax_error(text: str, exc: SyntaxError, indent: int) -> ExprError:
    """Python's syntax error restated in this language's terms, with the column in the original text."""
    msg, at = exc.msg, exc.offset or 0
    col = at + indent
    if "unterminated string" in msg:
        return ExprError(f"unterminated string (at column {col})")
    if "never closed" in msg:
        opening = msg.split("'")[1] if "'" in msg else "("
        closing = {"(": ")", "[": "]", "{": "}"}.get(opening, ")")
        return ExprError(f"'{opening}' at column {col} is never closed: expected '{closing}'")
    if "decimal literal" in msg:
        return ExprError(f"malformed number (at column {col})")
    if at < 1 or at > len(text.rstrip()):
        return ExprError("incomplete expression: expected more, found end of input")
    ch = text[at - 1]
    if ch in _REJECTED_CHARS:
        return ExprError(f"{_REJECTED_CHARS[ch]} (at column {col})")
    word = re.match(r"\w+|\S", text[at - 1 :]).group()
    return ExprError(f"expected an operator or the end, found {word!r} (at column {col})")


class Expr:
    """A parsed expression: ``names`` it reads, ``evaluate(env)`` its value, ``violation(env)`` for Optuna."""

    def __init__(self, text: str, root: ast.expr, names: set[str]):
        self.text = text
        self._root = root
        self._value = _compile(root)
        self.names = names
        # A single comparison's sides, for violation()'s graded value.
        single = isinstance(root, ast.Compare) and len(root.ops) == 1
        self._sides = (_compile(root.left), _compile(root.comparators[0])) if single else None

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"

    def __str__(self) -> str:
        return self.text

    @property
    def is_boolean(self) -> bool:
        """True when the top of the tree is a comparison, and/or/not, a boolean literal or a bare name
        (a boolean param): the forms that make sense as a constraint. ``a + 1`` is not."""
        root = self._root
        if isinstance(root, ast.Constant):
            return isinstance(root.value, bool)
        return isinstance(root, (ast.Compare, ast.BoolOp, ast.Name, ast.Attribute)) or (
            isinstance(root, ast.UnaryOp) and isinstance(root.op, ast.Not)
        )

    def evaluate(self, env: dict) -> Any:
        """The value of the expression with names looked up in ``env``; raises ExprError (unknown name,
        division by zero, arithmetic on a non-number)."""
        return self._value(env)

    def violation(self, env: dict) -> float:
        """0.0 when the expression holds, else a positive magnitude: ``|lhs - rhs|`` for a single numeric
        comparison (1.0 when that is 0, e.g. ``a != b`` with a == b), otherwise 1.0. Optuna's
        ``constraints_func`` reads values <= 0 as feasible, and a graded value gives TPE a slope to follow."""
        if self.evaluate(env):
            return 0.0
        if self._sides is not None:
            lhs, rhs = self._sides[0](env), self._sides[1](env)
            if _is_number(lhs) and _is_number(rhs):
                gap = abs(float(lhs) - float(rhs))
                if gap > 0 and math.isfinite(gap):
                    return gap
        return 1.0


def _compile(node: ast.expr) -> Callable[[dict], Any]:
    """A checked tree (only the node types ``_Checker`` lets through) as nested Python closures, one per node,
    each evaluating its children: the tree walked once here instead of at every evaluation (the grid proposer
    evaluates constraints over tens of thousands of points). No code is generated from the text."""
    if isinstance(node, ast.Constant):
        value = node.value
        return lambda env: value
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _compile_name(_dotted(node))
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand)
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        if isinstance(node.op, ast.USub):
            return lambda env: -_number("-", operand(env))
        return lambda env: +_number("+", operand(env))
    if isinstance(node, ast.BinOp):
        return _compile_binary(*_BINARY[type(node.op)], _compile(node.left), _compile(node.right))
    if isinstance(node, ast.BoolOp):
        # Short-circuit like Python, but always a bool: constraints are true or false.
        values, want = [_compile(v) for v in node.values], isinstance(node.op, ast.Or)
        return lambda env: want if any(bool(v(env)) == want for v in values) else not want
    if isinstance(node, ast.Compare):
        return _compile_compare(
            [_COMPARE[type(op)] for op in node.ops], [_compile(n) for n in (node.left, *node.comparators)]
        )
    if isinstance(node, ast.Call):
        name, args = _dotted(node.func), [_compile(a) for a in node.args]
        func = _FUNCTIONS[name]
        return lambda env: func([_number(f"{name}()", a(env)) for a in args])
    raise ExprError(f"cannot evaluate {type(node).__name__}")  # unreachable after _Checker


def _compile_name(name: str) -> Callable[[dict], Any]:
    if name in _BOOLEANS:
        value = _BOOLEANS[name]
        return lambda env: value

    def lookup(env: dict) -> Any:
        try:
            return env[name]
        except KeyError:
            raise ExprError(f"unknown name {name!r}") from None

    return lookup


def _compile_binary(op: str, fn: Callable, left: Callable, right: Callable) -> Callable[[dict], Any]:
    divides = op in ("/", "//", "%")

    def binary(env: dict) -> Any:
        a, b = _number(op, left(env)), _number(op, right(env))
        if divides and b == 0:
            raise ExprError(f"division by zero in '{op}'")
        return fn(a, b)

    return binary


def _compile_compare(ops: list, operands: list) -> Callable[[dict], bool]:
    def compare(env: dict) -> bool:
        left = operands[0](env)
        for (op, fn), node in zip(ops, operands[1:], strict=True):
            right = node(env)
            if op not in ("==", "!="):
                _number(op, left), _number(op, right)  # ordering strings or None is almost surely a mistake
            if not fn(left, right):
                return False
            left = right
        return True

    return compare


def parse(text: str) -> Expr:
    """Parse ``text`` into an Expr; raises ExprError with what is wrong and where (1-based column)."""
    if not isinstance(text, str):
        raise ExprError(f"an expression must be a string, got {type(text).__name__}")
    # Whitespace of any kind separates tokens, as in a YAML line folded over several. Python's eval mode would
    # read a newline as the end and a leading space as indentation: newlines become spaces (same columns), and
    # the leading ones are cut and counted back into every column reported.
    flat = "".join(" " if c.isspace() else c for c in text)
    body = flat.lstrip()
    if not body.strip():
        raise ExprError("empty expression")
    indent = len(flat) - len(body)
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError as exc:
        raise _syntax_error(body, exc, indent) from None
    checker = _Checker(body, indent)
    checker.visit(tree.body)
    return Expr(text, tree.body, checker.names)
