"""The constraint language (autoresearch.space.expr): what it evaluates, what it rejects and where, and that the text
is never executed (it is parsed by ``ast`` and evaluated by walking the tree)."""

from __future__ import annotations

import builtins

import pytest

from autoresearch.space.expr import ExprError, parse


@pytest.mark.parametrize(
    "text, env, expected",
    [
        (
            "parallel.dp_replicate * parallel.tp == world_size",
            {"parallel.dp_replicate": 2, "parallel.tp": 1, "world_size": 2},
            True,
        ),
        ("a % (b * c) == 0", {"a": 16, "b": 4, "c": 2}, True),
        ("a % (b * c) == 0", {"a": 16, "b": 3, "c": 2}, False),
        ("1 <= x < 4", {"x": 4}, False),  # chained like Python
        ("1 <= x < 4", {"x": 1}, True),
        ("not a or b and c", {"a": True, "b": True, "c": False}, False),
        ("min(a, b) + max(1, 2, 3)", {"a": 5, "b": 2}, 5),
        ("-x + 2 * 3 - 1", {"x": 1}, 4),
        ("7 // 2 + 7 % 2 + 7 / 2", {}, 3 + 1 + 3.5),
        ("lr <= 1e-3", {"lr": 0.001}, True),
        ("flag == true", {"flag": True}, True),
        ("(a + b) * 2 != 6", {"a": 1, "b": 2}, False),
        ("v == 1 or s == 'interleaved'", {"v": 2, "s": "interleaved"}, True),  # a choice's value as a string
        ('v == 1 or s == "interleaved"', {"v": 2, "s": "gpipe"}, False),
    ],
)
def test_expr_evaluates_the_grammar(text, env, expected):
    assert parse(text).evaluate(env) == expected


def test_expr_names_are_dotted_and_collected():
    assert parse("parallel.tp * min(a.b, c) <= world_size").names == {"parallel.tp", "a.b", "c", "world_size"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("__import__('os')", "'__import__' is not allowed"),
        ("a.b()", "calling a.b() is not allowed"),
        ("x[0]", "subscripts"),
        ("'s", "unterminated string"),
        ("x == 'it\\'s'", "no quotes, backslashes or prefixes inside"),
        ("lambda: 1", "'lambda' is not allowed"),
        ("open(1)", "calling open() is not allowed"),
        ("2 ** 3", "'**' is not allowed"),
        ("x if y else z", "'if' is not allowed"),
        ("a = 1", "use == to compare"),
        ("a +", "found end of input"),
        ("(a", "expected ')'"),
        ("", "empty expression"),
        ("a b", "expected an operator"),
    ],
)
def test_expr_rejects_everything_else(text, message):
    with pytest.raises(ExprError, match=None) as info:
        parse(text)
    assert message in str(info.value)


def test_expr_evaluation_errors_are_expr_errors():
    with pytest.raises(ExprError, match="unknown name 'b'"):
        parse("a < b").evaluate({"a": 1})
    with pytest.raises(ExprError, match="division by zero"):
        parse("a % b == 0").evaluate({"a": 1, "b": 0})
    with pytest.raises(ExprError, match="needs numbers"):
        parse("a + 1 > 0").evaluate({"a": "adamw"})


def test_expr_violation_is_graded_for_one_comparison():
    assert parse("a <= 2").violation({"a": 5}) == 3.0
    assert parse("a % b == 0").violation({"a": 8, "b": 3}) == 2.0
    assert parse("a != 2").violation({"a": 2}) == 1.0  # |lhs - rhs| is 0: still a violation
    assert parse("a < 2 and a > 0").violation({"a": 5}) == 1.0
    assert parse("a <= 2").violation({"a": 1}) == 0.0


def test_expr_is_boolean_tells_conditions_from_arithmetic():
    assert parse("a <= b").is_boolean and parse("not a").is_boolean and parse("a or b").is_boolean
    assert not parse("a + 1").is_boolean and not parse("3").is_boolean


@pytest.mark.parametrize(
    "text, message",
    [
        ("(a + 1).b", "only dotted names"),
        ("min(a, key=b)", "min() takes one or more positional arguments"),
        ("max()", "max() takes one or more positional arguments"),
        ("a is b", "'is' is not allowed"),
        ("a in b", "'in' is not allowed"),
        ("a not in b", "'not in' is not allowed"),
        ("a & b", "use 'and' instead of '&'"),
        ("a | b", "use 'or' instead of '|'"),
        ("a ^ b", "'^' is not allowed"),
        ("~a", "'~' is not allowed"),
        ("a << 1", "'<<' is not allowed"),
        ("a @ b", "'@' is not allowed"),
        ("a ! b", "use 'not' instead of '!'"),
        ("[1, 2]", "lists are not allowed"),
        ("{1: 2}", "dicts are not allowed"),
        ("{1}", "sets are not allowed"),
        ("(1, 2)", "tuples are not allowed"),
        ("a, b", "tuples are not allowed"),
        ("[x for x in y]", "comprehensions are not allowed"),
        ("(x for x in y)", "comprehensions are not allowed"),
        ("(a := 1)", "':=' is not allowed"),
        ("f'{a}' == 'b'", "f-strings are not allowed"),
        ("b'x' == a", "b'x' is not allowed"),
        ("r'x' == a", "no quotes, backslashes or prefixes inside"),
        ("'a' 'b' == c", "no quotes, backslashes or prefixes inside"),
        ("a == 0x10", "malformed number '0x10'"),
        ("a == 1_000", "malformed number '1_000'"),
        ("a == 1j", "1j is not allowed; only numbers, strings, true and false"),
        ("a == 2abc", "malformed number"),
        ("a == None", "None is not allowed"),
        ("a == ...", "... is not allowed"),
        ("a.__class__ == b", "'a.__class__' is not allowed: names starting with '__' are reserved"),
        ("os.system('x')", "calling os.system() is not allowed"),
        ("(lambda: 1)() == 1", "calling the result of 'lambda: 1' is not allowed"),
        ("import os", "expected an operator or the end, found 'import'"),
        ("a; b", "expected an operator or the end, found ';'"),
        ("a ==", "found end of input"),
        ("min(a,", "'(' at column 4 is never closed: expected ')'"),
        ("(a))", "expected an operator or the end, found ')'"),
        ("   ", "empty expression"),
    ],
)
def test_everything_outside_the_language_is_rejected_with_a_reason(text, message):
    with pytest.raises(ExprError) as info:
        parse(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "text, column",
    [
        ("a == b.__class__", 6),  # the node's own column
        ("  a == b.__class__", 8),  # leading spaces count
        ("a b", 3),
        ("  a b", 5),
        ("x[0] == 1", 1),
        ("a = 1", 3),
    ],
)
def test_errors_say_the_column_in_the_text_as_written(text, column):
    with pytest.raises(ExprError) as info:
        parse(text)
    assert str(info.value).endswith(f"(at column {column})")


def test_any_whitespace_separates_like_a_space():
    expr = parse("  parallel.pp > 1 or\n  parallel.pp_virtual == 1\t")
    assert expr.names == {"parallel.pp", "parallel.pp_virtual"}
    assert expr.evaluate({"parallel.pp": 1, "parallel.pp_virtual": 1}) is True
    assert expr.evaluate({"parallel.pp": 1, "parallel.pp_virtual": 2}) is False


def test_names_leave_out_booleans_and_functions():
    assert parse("flag == true or max(a, 1) > False").names == {"flag", "a"}


def test_bool_is_not_a_number_and_strings_only_compare_for_equality():
    with pytest.raises(ExprError, match="'\\+' needs numbers, got True"):
        parse("a + 1 > 0").evaluate({"a": True})
    with pytest.raises(ExprError, match="'<' needs numbers"):
        parse("s < 'b'").evaluate({"s": "a"})
    assert parse("s != 'b'").evaluate({"s": "a"}) is True


def test_and_or_short_circuit_and_return_booleans():
    # The right-hand side would fail (unknown name); Python's short-circuit never evaluates it.
    assert parse("a == 1 or missing > 0").evaluate({"a": 1}) is True
    assert parse("a == 2 and missing > 0").evaluate({"a": 1}) is False
    assert parse("a and b").evaluate({"a": 3, "b": "x"}) is True


def test_text_is_never_executed(monkeypatch, tmp_path):
    """Parsing and evaluating work with eval and exec gone, and code in a constraint does not run."""

    def refuse(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    assert parse("min(a, 2) * 3 == 6").evaluate({"a": 5}) is True
    marker = tmp_path / "ran"
    with pytest.raises(ExprError):
        parse(f"__import__('os').system('touch {marker}') == 0")
    with pytest.raises(ExprError):
        parse(f"open('{marker}', 'w') == 0")
    assert not marker.exists()
