"""A small, safe expression language for search-space constraints.

Constraints in ``search_spaces/*.yaml`` are written by people (and read by the agent), e.g.::

    parallel.dp_replicate * parallel.tp == world_size
    training.global_batch_size % (training.micro_batch_size * parallel.dp_replicate) == 0

They must never be handed to ``eval``: a space file is data. This module tokenizes and parses them with a
recursive-descent parser into a tiny tree of node objects and evaluates that tree itself.

Grammar (Python's precedence; ``true``/``false`` are an addition for boolean params)::

    expr       := or_expr
    or_expr    := and_expr ('or' and_expr)*
    and_expr   := not_expr ('and' not_expr)*
    not_expr   := 'not' not_expr | comparison
    comparison := arith (('=='|'!='|'<'|'<='|'>'|'>=') arith)*      # chained like Python: a < b < c
    arith      := term (('+'|'-') term)*
    term       := unary (('*'|'/'|'//'|'%') unary)*
    unary      := ('-'|'+') unary | atom
    atom       := NUMBER | STRING | 'true' | 'false' | NAME | ('min'|'max') '(' expr (',' expr)* ')' | '(' expr ')'
    NAME       := identifier ('.' identifier)*                       # dotted config keys: parallel.tp
    STRING     := "'" [^'"\\]* "'" | '"' [^'"\\]* '"'                  # a choice's value: 'interleaved'

Strings compare with ``==`` and ``!=`` only. Anything else (subscripts, attribute calls, lambdas, other
functions, ``**``) is rejected with a message saying what is not allowed.
"""

from __future__ import annotations

import keyword
import math
import re
from dataclasses import dataclass
from numbers import Real
from typing import Any, Callable, Iterator

__all__ = ["ExprError", "Expr", "parse"]


class ExprError(ValueError):
    """A constraint that does not parse, or cannot be evaluated on the given values."""


# ---------------------------------------------------------------------------------------------- tokens

_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Longest operators first so that "//" is not read as two "/".
_OPERATORS = ("//", "==", "!=", "<=", ">=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",")
_WORDS = {"and", "or", "not", "true", "false", "True", "False"}
_FUNCTIONS = {"min": min, "max": max}
# Characters people are likely to try, with the reason they fail (clearer than "unexpected character").
_STRING = re.compile(r"'([^'\"\\]*)'" + r'|"([^\'"\\]*)"')
_REJECTED_CHARS = {
    "'": "unterminated string (or a quote or backslash inside one)",
    '"': "unterminated string (or a quote or backslash inside one)",
    "[": "subscripts and lists are not allowed", "]": "subscripts and lists are not allowed",
    "{": "dicts and sets are not allowed", "}": "dicts and sets are not allowed",
    ":": "':' is not allowed (no lambdas, slices or dicts)", "=": "assignment is not allowed (use == to compare)",
    "@": "'@' is not allowed", "&": "use 'and' instead of '&'", "|": "use 'or' instead of '|'",
    "!": "use 'not' instead of '!'", "~": "'~' is not allowed", "^": "'^' is not allowed",
}


@dataclass(frozen=True)
class _Token:
    kind: str      # "num" | "str" | "name" | "word" | "op" | "end"
    text: str
    pos: int
    value: Any = None


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if text.startswith("**", i):
            raise ExprError(f"'**' is not allowed (at column {i + 1})")
        m = _NUMBER.match(text, i)
        if m and (ch.isdigit() or ch == "."):
            literal = m.group()
            # "1.e" or "2abc": a number glued to a name is a typo, not two tokens.
            if m.end() < len(text) and (text[m.end()].isalpha() or text[m.end()] == "_"):
                raise ExprError(f"malformed number starting at column {i + 1}: {text[i:m.end() + 1]!r}...")
            is_float = any(c in literal for c in ".eE")
            tokens.append(_Token("num", literal, i, float(literal) if is_float else int(literal)))
            i = m.end()
            continue
        m = _STRING.match(text, i)
        if m:
            tokens.append(_Token("str", m.group(), i, m.group(1) if m.group(1) is not None else m.group(2)))
            i = m.end()
            continue
        m = _NAME.match(text, i)
        if m:
            name = m.group()
            _check_name(name, i)
            kind = "word" if name in _WORDS else "name"
            tokens.append(_Token(kind, name, i))
            i = m.end()
            continue
        op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
        if op is None:
            reason = _REJECTED_CHARS.get(ch, f"unexpected character {ch!r}")
            raise ExprError(f"{reason} (at column {i + 1})")
        tokens.append(_Token("op", op, i))
        i += len(op)
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _check_name(name: str, pos: int) -> None:
    for part in name.split("."):
        if part.startswith("__"):
            raise ExprError(f"{name!r} is not allowed: names starting with '__' are reserved (at column {pos + 1})")
        if keyword.iskeyword(part) and part not in _WORDS:
            raise ExprError(f"{part!r} is not allowed in a constraint (at column {pos + 1}); only arithmetic, "
                            "comparisons, and/or/not and min/max")


# ---------------------------------------------------------------------------------------------- nodes
# Each node knows its names and how to evaluate itself; nothing here ever calls eval/compile.

def _is_number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _need_numbers(op: str, *values: Any) -> None:
    for v in values:
        if not _is_number(v):
            raise ExprError(f"'{op}' needs numbers, got {v!r}")


class _Node:
    def names(self) -> Iterator[str]:
        return iter(())

    def evaluate(self, env: dict) -> Any:
        raise NotImplementedError


@dataclass
class _Const(_Node):
    value: Any

    def evaluate(self, env):
        return self.value


@dataclass
class _Name(_Node):
    name: str

    def names(self):
        yield self.name

    def evaluate(self, env):
        if self.name not in env:
            raise ExprError(f"unknown name {self.name!r}")
        return env[self.name]


@dataclass
class _Unary(_Node):
    op: str
    operand: _Node

    def names(self):
        yield from self.operand.names()

    def evaluate(self, env):
        v = self.operand.evaluate(env)
        if self.op == "not":
            return not v
        _need_numbers(self.op, v)
        return -v if self.op == "-" else +v


def _divide(op: str, a, b):
    if b == 0:
        raise ExprError(f"division by zero in '{op}'")
    if op == "/":
        return a / b
    return a // b if op == "//" else a % b


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: _divide("/", a, b),
    "//": lambda a, b: _divide("//", a, b),
    "%": lambda a, b: _divide("%", a, b),
}


@dataclass
class _Binary(_Node):
    op: str
    left: _Node
    right: _Node

    def names(self):
        yield from self.left.names()
        yield from self.right.names()

    def evaluate(self, env):
        a, b = self.left.evaluate(env), self.right.evaluate(env)
        _need_numbers(self.op, a, b)
        return _ARITH[self.op](a, b)


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


@dataclass
class _Compare(_Node):
    operands: list[_Node]
    ops: list[str]

    def names(self):
        for o in self.operands:
            yield from o.names()

    def evaluate(self, env):
        left = self.operands[0].evaluate(env)
        for op, node in zip(self.ops, self.operands[1:]):
            right = node.evaluate(env)
            if op not in ("==", "!="):
                _need_numbers(op, left, right)   # ordering strings or None is almost surely a mistake
            if not _COMPARE[op](left, right):
                return False
            left = right
        return True


@dataclass
class _BoolOp(_Node):
    op: str             # "and" | "or"
    operands: list[_Node]

    def names(self):
        for o in self.operands:
            yield from o.names()

    def evaluate(self, env):
        # Short-circuit like Python, but always return a bool: constraints are true or false.
        for node in self.operands:
            v = bool(node.evaluate(env))
            if self.op == "and" and not v:
                return False
            if self.op == "or" and v:
                return True
        return self.op == "and"


@dataclass
class _Call(_Node):
    func: str
    args: list[_Node]

    def names(self):
        for a in self.args:
            yield from a.names()

    def evaluate(self, env):
        values = [a.evaluate(env) for a in self.args]
        _need_numbers(f"{self.func}()", *values)
        return _FUNCTIONS[self.func](values)


# ---------------------------------------------------------------------------------------------- parser

class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def accept(self, *texts: str) -> _Token | None:
        tok = self.peek()
        if tok.kind in ("op", "word") and tok.text in texts:
            return self.take()
        return None

    def fail(self, tok: _Token, what: str) -> ExprError:
        found = "end of input" if tok.kind == "end" else repr(tok.text)
        return ExprError(f"expected {what}, found {found} (at column {tok.pos + 1})")

    def parse(self) -> _Node:
        if self.peek().kind == "end":
            raise ExprError("empty expression")
        node = self.or_expr()
        tok = self.peek()
        if tok.kind != "end":
            raise self.fail(tok, "an operator or the end")
        return node

    def or_expr(self) -> _Node:
        operands = [self.and_expr()]
        while self.accept("or"):
            operands.append(self.and_expr())
        return operands[0] if len(operands) == 1 else _BoolOp("or", operands)

    def and_expr(self) -> _Node:
        operands = [self.not_expr()]
        while self.accept("and"):
            operands.append(self.not_expr())
        return operands[0] if len(operands) == 1 else _BoolOp("and", operands)

    def not_expr(self) -> _Node:
        if self.accept("not"):
            return _Unary("not", self.not_expr())
        return self.comparison()

    def comparison(self) -> _Node:
        operands, ops = [self.arith()], []
        while (tok := self.accept(*_COMPARE)) is not None:
            ops.append(tok.text)
            operands.append(self.arith())
        return operands[0] if not ops else _Compare(operands, ops)

    def arith(self) -> _Node:
        node = self.term()
        while (tok := self.accept("+", "-")) is not None:
            node = _Binary(tok.text, node, self.term())
        return node

    def term(self) -> _Node:
        node = self.unary()
        while (tok := self.accept("*", "/", "//", "%")) is not None:
            node = _Binary(tok.text, node, self.unary())
        return node

    def unary(self) -> _Node:
        if (tok := self.accept("-", "+")) is not None:
            return _Unary(tok.text, self.unary())
        return self.atom()

    def atom(self) -> _Node:
        tok = self.take()
        if tok.kind in ("num", "str"):
            return _Const(tok.value)
        if tok.kind == "word" and tok.text in ("true", "false", "True", "False"):
            return _Const(tok.text.lower() == "true")
        if tok.kind == "op" and tok.text == "(":
            node = self.or_expr()
            if not self.accept(")"):
                raise self.fail(self.peek(), "')'")
            return node
        if tok.kind == "name":
            if self.peek().text == "(" and self.peek().kind == "op":
                return self.call(tok)
            return _Name(tok.text)
        raise self.fail(tok, "a number, a name or '('")

    def call(self, name: _Token) -> _Node:
        if name.text not in _FUNCTIONS:
            raise ExprError(f"calling {name.text}() is not allowed (at column {name.pos + 1}); "
                            "only min() and max() may be called")
        self.take()  # "("
        args = [self.or_expr()]
        while self.accept(","):
            args.append(self.or_expr())
        if not self.accept(")"):
            raise self.fail(self.peek(), "',' or ')'")
        return _Call(name.text, args)


# ---------------------------------------------------------------------------------------------- public

class Expr:
    """A parsed expression: ``names`` it reads, ``evaluate(env)`` its value, ``violation(env)`` for Optuna."""

    def __init__(self, text: str, root: _Node):
        self.text = text
        self._root = root
        self.names: set[str] = set(root.names())

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"

    def __str__(self) -> str:
        return self.text

    @property
    def is_boolean(self) -> bool:
        """True when the top of the tree is a comparison, and/or/not, a boolean literal or a bare name
        (a boolean param): the forms that make sense as a constraint. ``a + 1`` is not."""
        root = self._root
        if isinstance(root, _Const):
            return isinstance(root.value, bool)
        return isinstance(root, (_Compare, _BoolOp, _Name)) or (isinstance(root, _Unary) and root.op == "not")

    def evaluate(self, env: dict) -> Any:
        """The value of the expression with names looked up in ``env``; raises ExprError (unknown name,
        division by zero, arithmetic on a non-number)."""
        return self._root.evaluate(env)

    def violation(self, env: dict) -> float:
        """0.0 when the expression holds, else a positive magnitude: ``|lhs - rhs|`` for a single numeric
        comparison (1.0 when that is 0, e.g. ``a != b`` with a == b), otherwise 1.0. Optuna's
        ``constraints_func`` reads values <= 0 as feasible, and a graded value gives TPE a slope to follow."""
        if self.evaluate(env):
            return 0.0
        root = self._root
        if isinstance(root, _Compare) and len(root.ops) == 1:
            lhs, rhs = root.operands[0].evaluate(env), root.operands[1].evaluate(env)
            if _is_number(lhs) and _is_number(rhs):
                gap = abs(float(lhs) - float(rhs))
                if gap > 0 and math.isfinite(gap):
                    return gap
        return 1.0


def parse(text: str) -> Expr:
    """Parse ``text`` into an Expr; raises ExprError with what is wrong and where."""
    if not isinstance(text, str):
        raise ExprError(f"an expression must be a string, got {type(text).__name__}")
    return Expr(text, _Parser(text).parse())

