"""The safe expression language: what it computes, and everything it must refuse."""
from __future__ import annotations

import pytest

from parascale.bench import expr
from parascale.bench.expr import ExprError, evaluate, names, to_text
from parascale.errors import UsageError


@pytest.mark.parametrize("text, expected", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("2 ** 3 ** 2", 512),  # right-associative, as in Python
    ("-2 ** 2", -4),
    ("7 / 2", 3.5),
    ("7 // 2", 3),
    ("-7 // 2", -4),
    ("7 % 3", 1),
    ("+3 - -2", 5),
    ("2 ** -1", 0.5),
    ("1.5 * 2", 3.0),
    ("'a' + 'b'", "ab"),
    ("'ab' * 3", "ababab"),
    ("[1, 2] + [3]", [1, 2, 3]),
    ("(1, 'x')", (1, "x")),
    ("None", None),
])
def test_arithmetic_and_literals(text, expected):
    assert evaluate(text, {}) == expected


@pytest.mark.parametrize("text, expected", [
    ("1 < 2 < 3", True),
    ("1 < 3 < 2", False),
    ("2 == 2.0", True),
    ("'a' != 'b'", True),
    ("3 >= 3 > 2 <= 2", True),
    ("'pu' in 'gpu'", True),
    ("4 not in [1, 2]", True),
    ("not 0", True),
    ("0 or 'x'", "x"),
    ("1 and 0", 0),
    ("1 and 2 and 3", 3),
    ("'yes' if 2 > 1 else 'no'", "yes"),
    ("'yes' if 2 < 1 else 'no'", "no"),
    ("1 if 0 else 2 if 0 else 3", 3),
])
def test_comparisons_booleans_conditionals(text, expected):
    assert evaluate(text, {}) == expected


def test_short_circuit_does_not_evaluate_the_other_side():
    assert evaluate("0 and 1 / 0", {}) == 0
    assert evaluate("1 or missing", {}) == 1
    assert evaluate("1 if True else 1 / 0", {}) == 1


@pytest.mark.parametrize("text, expected", [
    ("min(3, 1, 2)", 1),
    ("max([4, 9])", 9),
    ("abs(-3)", 3),
    ("round(2.567, 2)", 2.57),
    ("round(2.5)", 2),
    ("int('12') + int(3.9)", 15),
    ("float('1.5')", 1.5),
    ("str(12) + 'x'", "12x"),
    ("len('abcd')", 4),
    ("format('{}-{}', 'a', 3)", "a-3"),
    ("format('{1}{0}', 'a', 'b')", "ba"),
    ("format('{:.2f}', 3.14159)", "3.14"),
    ("format('{:>5}|', 'ab')", "   ab|"),
])
def test_whitelisted_functions(text, expected):
    assert evaluate(text, {}) == expected


def test_names_and_references_read_the_environment():
    env = {"gb": 256, "workers": 4, "device": "gpu", "flag": True}
    assert evaluate("gb // workers", env) == 64
    assert evaluate("${gb} // ${workers}", env) == 64
    assert evaluate("${gb}//${ workers }", env) == 64
    # inside a string literal a reference is replaced by the value's text (DLBS style)
    assert evaluate("'${device}' == 'gpu'", env) is True
    assert evaluate("'n=${workers} ${flag}'", env) == "n=4 true"


def test_names_lists_referenced_parameters_but_not_functions():
    assert names("max(a, ${b}) + len('${c}') + round(d)") == {"a", "b", "c", "d"}
    assert names("1 + 2") == set()


def test_unknown_name_lists_known_names():
    with pytest.raises(ExprError, match=r"unknown name 'gpus'.*'gpus \* 2'.*known names: a, b"):
        evaluate("gpus * 2", {"a": 1, "b": 2})


def test_expr_error_is_a_usage_error():
    assert issubclass(ExprError, UsageError)


@pytest.mark.parametrize("text, what", [
    ("().__class__", "attribute access"),
    ("x.y", "attribute access"),
    ("'a'.upper()", "calls to anything but a bare function name"),
    ("open('f')", "calls to 'open'"),
    ("__import__('os')", "calls to '__import__'"),
    ("eval('1')", "calls to 'eval'"),
    ("exec('1')", "calls to 'exec'"),
    ("getattr(x, 'y')", "calls to 'getattr'"),
    ("x[0]", "subscripts"),
    ("'abc'[1:]", "subscripts"),
    ("lambda: 1", "lambda"),
    ("[i for i in x]", "comprehensions"),
    ("(i for i in x)", "comprehensions"),
    ("{k: 1 for k in x}", "comprehensions"),
    ("{'a': 1}", "dict literals"),
    ("{1, 2}", "set literals"),
    ("f'{x}'", "f-strings"),
    ("(y := 1)", "assignment expressions"),
    ("min(*x)", "starred"),
    ("max(x, key=abs)", "keyword arguments"),
    ("__builtins__", "dunder name"),
    ("1 << 3", "operator '<<'"),
    ("~1", "operator '~'"),
    ("x is None", "comparison 'is'"),
    ("b'x'", "bytes literals"),
    ("1j", "complex literals"),
    ("...", "ellipsis literals"),
])
def test_refuses_everything_outside_the_language(text, what):
    with pytest.raises(ExprError, match="not allowed") as info:
        evaluate(text, {"x": [1, 2]})
    assert what in str(info.value)
    assert repr(text) in str(info.value) or text in str(info.value)


def test_forbidden_syntax_fails_even_in_an_untaken_branch():
    with pytest.raises(ExprError, match="attribute access"):
        evaluate("1 if True else x.y", {"x": 1})


@pytest.mark.parametrize("text", ["import os", "x = 1", "def f(): pass", "1 +", "", "a b"])
def test_statements_and_bad_syntax_do_not_parse(text):
    with pytest.raises(ExprError, match="invalid expression"):
        evaluate(text, {"a": 1, "b": 2})


@pytest.mark.parametrize("text", [
    "2 ** 100",
    "2 ** 65",
    "10 ** 10 ** 10",
    "2.0 ** 1000",
    "(10 ** 60) ** 60",
])
def test_huge_powers_are_refused(text):
    with pytest.raises(ExprError, match="too large"):
        evaluate(text, {})


@pytest.mark.parametrize("text", [
    "'a' * 10 ** 9",
    "[0] * 100000",
    "'x' * 6000 + 'y' * 6000",
    "format('{:100000}', 1)",
    "'%999999d' % 1",
    "round(5, -10 ** 18)",
])
def test_oversized_results_are_refused(text):
    with pytest.raises(ExprError):
        evaluate(text, {})


def test_expression_length_is_limited():
    with pytest.raises(ExprError, match="characters long"):
        evaluate("1+" * 600 + "1", {})


@pytest.mark.parametrize("template", ["{0.__class__}", "{0[0]}", "{name}", "{:{}}"])
def test_format_allows_positional_fields_only(template):
    with pytest.raises(ExprError, match="format"):
        evaluate(f"format('{template}', x, 1)", {"x": [1]})


@pytest.mark.parametrize("text", ["1 / 0", "1 % 0", "'a' + 1", "int('x')", "min([])", "'a' < 1"])
def test_runtime_errors_become_expr_errors(text):
    with pytest.raises(ExprError, match="cannot evaluate"):
        evaluate(text, {})


def test_malformed_reference_is_reported():
    with pytest.raises(ExprError, match="malformed reference"):
        evaluate("${a.b} + 1", {})
    with pytest.raises(ExprError, match="malformed reference"):
        evaluate("'${' + 'x'", {})


def test_non_string_expression_is_refused():
    with pytest.raises(ExprError, match="must be a string"):
        evaluate(3, {})  # type: ignore[arg-type]


def test_function_names_cannot_be_shadowed_into_calls_of_values():
    # calling goes to the whitelisted function, never to a value from the environment
    assert evaluate("len(x)", {"x": "abc", "len": print}) == 3


def test_to_text_uses_json_spellings():
    assert [to_text(v) for v in (True, False, None, 3, 1.5, "s", [1, "a"])] == \
        ["true", "false", "null", "3", "1.5", "s", '[1, "a"]']


@pytest.mark.parametrize("text", ["-" * 999 + "1", "not " * 240 + "1", "1+" * 400 + "1",
                                  "(" * 400 + "1" + ")" * 400, "[" * 300 + "]" * 300])
def test_deep_nesting_is_an_expr_error_not_a_crash(text):
    with pytest.raises(ExprError):
        evaluate(text, {})


def test_moderate_nesting_still_works():
    assert evaluate("1+" * 150 + "1", {}) == 151
    assert evaluate("-" * 100 + "1", {}) == 1


@pytest.mark.parametrize("text", [
    "[[0] * 100] * 101",  # 10,100 numbers in 101 shared rows
    "len([[[0] * 100] * 100] * 100)",  # a million, never built
    "len([[0] * 10000] + [[1] * 10000])",
    "(1, (2,) * 10000)",
    "[10 ** 60 * 10 ** 60 * 10 ** 60 * 10 ** 60] * 1000",  # 241 digits: 13 units each
])
def test_values_are_measured_with_nested_lists_counted_in_full(text):
    with pytest.raises(ExprError, match=r"limit 10,000"):
        evaluate(text, {})


def test_nested_repetition_from_the_issue_is_refused_at_once():
    with pytest.raises(ExprError, match=r"repeating a value of size 10,000 10000 times is too "
                                        r"large \(limit 10,000\)"):
        evaluate("len(str([[[0]*10000]*10000]*10000))", {})


def test_values_read_from_the_study_are_bounded_too():
    with pytest.raises(ExprError, match=r"limit 10,000"):
        evaluate("len(x)", {"x": list(range(20_000))})
    assert evaluate("len(x)", {"x": list(range(10_000))}) == 10_000


def test_text_is_measured_before_it_is_built():
    with pytest.raises(ExprError, match=r"would be 15,012 characters long \(limit 10,000\)"):
        evaluate("'${x}${x}${x}'", {"x": "y" * 5000})
    with pytest.raises(ExprError, match=r"format\(\) would make about 20,000 characters"):
        evaluate("format(t, x)", {"t": "{0}" * 200, "x": "y" * 100})


def test_evaluation_has_a_deadline(monkeypatch):
    monkeypatch.setattr(expr, "MAX_SECONDS", -1.0)  # any evaluation is past it at its first step
    with pytest.raises(ExprError, match=r"took longer than -1 s \(the limit\)"):
        evaluate("1 + 1", {})


def test_values_at_the_limits_still_work():
    assert evaluate("len([[0] * 100] * 100)", {}) == 100
    assert evaluate("len('x' * 10000)", {}) == 10_000
    assert evaluate("len(str(2 ** 64))", {}) == 20
