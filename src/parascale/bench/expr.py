"""A small, safe expression language for computed study parameters.

DLBS evaluates ``$( ... )$`` values with Python's ``eval``, so a study file could run any code on
every machine it is copied to. We parse with :mod:`ast` and interpret a whitelist of node types
ourselves: an expression can only compute a value from the names it is given.

The language:

- constants: int, float, str, ``True``/``False``/``None``; tuple and list literals
- names, looked up in the environment; ``${name}`` is the same as ``name``; inside a string
  literal ``'${name}'`` is replaced by the value's text (DLBS writes ``'${device}' == 'gpu'``)
- unary ``+ - not``; binary ``+ - * / // % **``; comparisons ``== != < <= > >= in not in``
  (chained); ``and``/``or``; ``a if c else b``
- calls by bare name to: min, max, abs, round, int, float, str, len, format(template, *args)

Sizes are limited so that a typo such as ``2 ** 10 ** 9`` or a hostile study file fails at once
with one line instead of hanging the planner: the expression's length and nesting, the size of
every value it computes or reads (:data:`MAX_SIZE`, checked before a repetition or concatenation
is built, not after), integers, exponents, format widths, and the evaluation time
(:data:`MAX_SECONDS`, a deadline checked at every step of the walk).
"""
from __future__ import annotations

import ast
import functools
import json
import operator
import re
import string
import time
from collections.abc import Callable, Mapping
from typing import Any

from parascale.errors import UsageError

__all__ = ["ExprError", "FUNCTIONS", "evaluate", "names", "size_of", "to_text", "REF_RE"]

MAX_EXPR_CHARS = 1000
MAX_SIZE = 10_000
"""The largest value: a string's characters, 1 for a number (an integer of more than 20 digits:
1 per 20 digits), and for a list or tuple its items' sizes added up, a nested list counted in full
every time it appears: ``[[0] * 100] * 100`` has size 10,000, however little memory it takes."""
MAX_SECONDS = 1.0  # one evaluation; the limits above keep real expressions far below it
MAX_EXPONENT = 64
MAX_INT_BITS = 4096
MAX_ROUND_DIGITS = 64
MAX_DEPTH = 200  # nesting; keeps the recursive checker and evaluator far from Python's limit

#: ``${name}``: a reference to a parameter (names are Python identifiers).
REF_RE = re.compile(r"\$\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}")


class ExprError(UsageError):
    """An expression is malformed, uses something outside the safe language, or fails."""


def to_text(value: object) -> str:
    """The text a value contributes when substituted into a string.

    JSON spellings for booleans, null and lists, so that ``-P flag=true`` reads back as ``true``.
    """
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


def size_of(value: object) -> int:
    """The size of ``value`` as :data:`MAX_SIZE` counts it.

    Walked without recursion and measured once per object, so a list that appears 10,000 times
    costs one measurement, yet counts 10,000 times.
    """
    def scalar(item: object) -> int:
        if isinstance(item, str):
            return max(1, len(item))
        if isinstance(item, int) and not isinstance(item, bool):
            return 1 + int(item.bit_length() * 0.30103) // 20  # 20 digits (64 bits) a unit
        return 1

    if not isinstance(value, (list, tuple)):
        return scalar(value)
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # being measured: met again inside itself, it is a cycle
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        seq, measured = stack.pop()
        if measured:
            open_.discard(id(seq))
            sizes[id(seq)] = max(1, sum(sizes[id(item)] if isinstance(item, (list, tuple))
                                        else scalar(item) for item in seq))
        elif id(seq) in open_:
            raise ValueError("a list that contains itself has no size")
        elif id(seq) not in sizes:
            open_.add(id(seq))
            stack.append((seq, True))
            stack.extend((item, False) for item in seq if isinstance(item, (list, tuple)))
    return sizes[id(value)]


def _format(template: object, *args: object) -> str:
    """``str.format`` restricted to positional fields: ``{0.__class__}`` would reach objects."""
    if not isinstance(template, str):
        raise ValueError("format() needs a string template as its first argument")
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"bad format template {template!r}: {exc}") from None
    for _literal, field, spec, _conversion in fields:
        if field is None:
            continue
        if "." in field or "[" in field:
            raise ValueError(f"format() field {{{field}}} uses attribute or index access, "
                             "which is not allowed; use {} or {0}")
        if field and not (field.isascii() and field.isdigit()):
            raise ValueError(f"format() field {{{field}}} must be positional in ASCII digits: {{}} or {{0}}")
        if spec and "{" in spec:
            raise ValueError(f"format() field spec {spec!r} has nested fields, not allowed")
        if spec and not spec.isascii():  # format() reads '٣' as a width of 3
            raise ValueError(f"format() field spec {spec!r} must be ASCII, e.g. '>8' or '.2f'")
        if spec and any(int(n) > MAX_SIZE for n in re.findall(r"\d+", spec)):
            raise ValueError(f"format() width or precision in {spec!r} is too large")
    # how long the text will be, before it is built: '{0}' * 2000 of a long string stops here
    total, auto = 0, 0
    for literal, field, spec, _conversion in fields:
        total += len(literal)
        if field is None:
            continue
        index = int(field) if field else auto
        auto += not field
        arg = args[index] if index < len(args) else None  # format() reports a missing one
        total += max([size_of(arg), *(int(n) for n in re.findall(r"\d+", spec or ""))])
    if total > MAX_SIZE:
        raise ValueError(f"format() would make about {total:,} characters (limit {MAX_SIZE:,})")
    return template.format(*args)


def _round(number: Any, ndigits: Any = None) -> Any:
    # round(5, -10**18) would build 10**(10**18): bound the digits
    if isinstance(ndigits, int) and abs(ndigits) > MAX_ROUND_DIGITS:
        raise ValueError(f"round() digits {ndigits} out of range (limit {MAX_ROUND_DIGITS})")
    return round(number, ndigits)


def _ascii(convert: Callable[..., Any]) -> Callable[..., Any]:
    """int()/float() that read text in ASCII digits only: they also take '５' and '1_0'."""
    def call(value: Any = 0, *rest: Any) -> Any:
        if isinstance(value, str) and not (value.isascii() and "_" not in value):
            raise ValueError(f"{convert.__name__}() reads ASCII digits only, got {value!r}")
        return convert(value, *rest)
    return call


#: The only callables an expression can reach, by bare name. All are pure.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min, "max": max, "abs": abs, "round": _round, "int": _ascii(int),
    "float": _ascii(float),
    "str": str, "len": len, "format": _format,
}

_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_}
_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_FORBIDDEN = {
    ast.Attribute: "attribute access", ast.Subscript: "subscripts", ast.Slice: "slices",
    ast.Lambda: "lambda", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "comprehensions",
    ast.JoinedStr: "f-strings", ast.NamedExpr: "assignment expressions (:=)",
    ast.Starred: "starred arguments", ast.Dict: "dict literals", ast.Set: "set literals",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield",
}
_OP_SYMBOLS = {
    ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>",
    ast.MatMult: "@", ast.Invert: "~", ast.Is: "is", ast.IsNot: "is not",
}


def _replace_refs(text: str) -> str:
    """Turn ``${name}`` outside string literals into the bare name.

    References inside string literals stay: they interpolate text when evaluated, and rewriting
    them here would change the literal.
    """
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and i + 1 < len(text):
                out.append(text[i:i + 2])
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif text.startswith("${", i):
            match = REF_RE.match(text, i)
            if not match:
                raise ExprError(f"malformed reference {text[i:i + 20]!r} in expression "
                                f"{text!r}: write ${{name}} with a plain identifier")
            out.append(f" {match.group(1)} ")  # spaces keep '${a}${b}' a syntax error
            i = match.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _refuse(what: str, node: ast.AST, source: str, text: str) -> ExprError:
    segment = ast.get_source_segment(source, node) or type(node).__name__
    return ExprError(f"not allowed in expressions: {what} (found {segment.strip()!r} "
                     f"in {text!r})")


def _check(node: ast.AST, source: str, text: str) -> None:
    """Reject, before evaluating anything, every node outside the whitelist.

    Checking the whole tree up front means ``x if c else y.z`` fails even when the branch with
    the forbidden part would not have been taken.
    """
    def sub(*children: ast.AST) -> None:
        for child in children:
            _check(child, source, text)

    if isinstance(node, ast.Constant):
        if not (node.value is None or isinstance(node.value, (bool, int, float, str))):
            raise _refuse(f"{type(node.value).__name__} literals", node, source, text)
        if isinstance(node.value, str) and "${" in node.value:
            if "${" in REF_RE.sub("", node.value):
                raise ExprError(f"malformed reference in string {node.value!r} in expression "
                                f"{text!r}: write ${{name}} with a plain identifier")
    elif isinstance(node, ast.Name):
        if node.id.startswith("__"):
            raise _refuse(f"the dunder name {node.id!r}", node, source, text)
    elif isinstance(node, (ast.UnaryOp, ast.BinOp)):
        table = _UNARY if isinstance(node, ast.UnaryOp) else _BINARY
        if type(node.op) not in table:
            symbol = _OP_SYMBOLS.get(type(node.op), type(node.op).__name__)
            raise _refuse(f"the operator {symbol!r}", node, source, text)
        sub(*([node.operand] if isinstance(node, ast.UnaryOp) else [node.left, node.right]))
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARE:
                symbol = _OP_SYMBOLS.get(type(op), type(op).__name__)
                raise _refuse(f"the comparison {symbol!r}", node, source, text)
        sub(node.left, *node.comparators)
    elif isinstance(node, ast.BoolOp):
        sub(*node.values)
    elif isinstance(node, ast.IfExp):
        sub(node.test, node.body, node.orelse)
    elif isinstance(node, (ast.Tuple, ast.List)):
        sub(*node.elts)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            raise _refuse("calls to anything but a bare function name", node, source, text)
        if node.func.id not in FUNCTIONS:
            allowed = ", ".join(FUNCTIONS)
            raise _refuse(f"calls to {node.func.id!r} (allowed functions: {allowed})",
                          node, source, text)
        if node.keywords:
            raise _refuse("keyword arguments", node, source, text)
        sub(*node.args)
    else:
        what = _FORBIDDEN.get(type(node), f"{type(node).__name__} syntax")
        raise _refuse(what, node, source, text)


def _parse(text: str) -> ast.Expression:
    if not isinstance(text, str):
        raise ExprError(f"an expression must be a string, not {type(text).__name__}")
    if len(text) > MAX_EXPR_CHARS:
        raise ExprError(f"expression is {len(text)} characters long (limit {MAX_EXPR_CHARS}): "
                        f"{text[:60]!r}...")
    return _parse_vetted(text)


@functools.lru_cache(maxsize=1024)
def _parse_vetted(text: str) -> ast.Expression:
    """Parse and vet once; a plan evaluates the same few expressions for every configuration."""
    source = _replace_refs(text)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"invalid expression {text!r}: {exc.msg} (only expressions are allowed, "
                        "not statements such as import or assignment)") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ExprError(f"cannot parse expression {text!r}: {exc or 'too deeply nested'}") from None
    if _depth(tree) > MAX_DEPTH:
        raise ExprError(f"expression {text!r} is nested more than {MAX_DEPTH} levels deep")
    _check(tree.body, source.strip(), text)
    return tree


def _depth(tree: ast.AST) -> int:
    """Nesting depth, computed without recursion so that it cannot overflow the stack itself."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    return deepest


def names(text: str) -> set[str]:
    """The parameter names an expression refers to, so a planner can resolve them first."""
    found: set[str] = set()
    callees = set()
    for node in ast.walk(_parse(text)):
        if isinstance(node, ast.Call):
            callees.add(id(node.func))
        elif isinstance(node, ast.Name) and id(node) not in callees:
            found.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(REF_RE.findall(node.value))
    return found


def _show(number: object) -> str:
    text = str(number)
    return text if len(text) <= 20 else f"a number of {len(text)} digits"


class _Evaluator:
    def __init__(self, text: str, env: Mapping[str, object]):
        self.text = text
        self.env = env
        self.deadline = time.monotonic() + MAX_SECONDS

    def fail(self, message: str, detail: str = "") -> ExprError:
        return ExprError(f"{message} in expression {self.text!r}{detail}")

    def lookup(self, name: str) -> object:
        try:
            return self.limit(self.env[name])
        except KeyError:
            known = ", ".join(sorted(self.env)) or "(none)"
            raise self.fail(f"unknown name {name!r}", f"; known names: {known}") from None

    def limit(self, value: Any) -> Any:
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise self.fail(f"integer result larger than 2**{MAX_INT_BITS} (the limit)")
        if isinstance(value, (str, list, tuple)) and size_of(value) > MAX_SIZE:
            raise self.fail(f"a value of size {size_of(value):,} (limit {MAX_SIZE:,}: characters, "
                            "numbers and list items, nested lists counted in full)")
        return value

    def guard(self, op: type, left: Any, right: Any) -> None:
        """Refuse before computing what would take unbounded time or memory."""
        if op is ast.Pow and isinstance(right, (int, float)):
            if abs(right) > MAX_EXPONENT:
                raise self.fail(f"exponent {_show(right)} is too large (limit {MAX_EXPONENT})")
            if isinstance(left, int) and isinstance(right, int) and right > 0 \
                    and left.bit_length() * right > MAX_INT_BITS:
                raise self.fail(f"result of {_show(left)} ** {right} is too large (limit "
                                f"2**{MAX_INT_BITS})")
        if op is ast.Mult:
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int) \
                        and size_of(seq) * max(count, 0) > MAX_SIZE:
                    raise self.fail(f"repeating a value of size {size_of(seq):,} "
                                    f"{_show(count)} times is too large (limit {MAX_SIZE:,})")
        if op is ast.Add and isinstance(left, (str, list, tuple)) \
                and isinstance(right, (str, list, tuple)) \
                and size_of(left) + size_of(right) > MAX_SIZE:
            raise self.fail(f"joining values of size {size_of(left):,} and {size_of(right):,} "
                            f"is too large (limit {MAX_SIZE:,})")
        if op is ast.Mod and isinstance(left, str):
            raise self.fail("'%' formatting of strings is not allowed (use format())")

    def interpolate(self, value: str) -> str:
        texts = {name: to_text(self.lookup(name)) for name in set(REF_RE.findall(value))}
        total = len(value) + sum(len(texts[m.group(1)]) for m in REF_RE.finditer(value))
        if total > MAX_SIZE:  # '${x}${x}${x}...': measured before it is built
            raise self.fail(f"the string would be {total:,} characters long (limit {MAX_SIZE:,})")
        return REF_RE.sub(lambda m: texts[m.group(1)], value)

    def run(self, node: ast.AST) -> Any:
        if time.monotonic() > self.deadline:
            raise self.fail(f"evaluation took longer than {MAX_SECONDS:g} s (the limit)")
        if isinstance(node, ast.Constant):
            value = node.value
            return self.limit(self.interpolate(value)) if isinstance(value, str) else value
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.UnaryOp):
            return self.limit(_UNARY[type(node.op)](self.run(node.operand)))
        if isinstance(node, ast.BinOp):
            left, right = self.run(node.left), self.run(node.right)
            self.guard(type(node.op), left, right)
            return self.limit(_BINARY[type(node.op)](left, right))
        if isinstance(node, ast.BoolOp):
            want_truthy = isinstance(node.op, ast.Or)
            for child in node.values:
                result = self.run(child)
                if bool(result) == want_truthy:
                    return result
            return result
        if isinstance(node, ast.Compare):
            left = self.run(node.left)
            for op, comparator in zip(node.ops, node.comparators):
                right = self.run(comparator)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.run(node.body) if self.run(node.test) else self.run(node.orelse)
        if isinstance(node, ast.Tuple):
            return self.limit(tuple(self.run(e) for e in node.elts))
        if isinstance(node, ast.List):
            return self.limit([self.run(e) for e in node.elts])
        if isinstance(node, ast.Call):
            args = [self.run(a) for a in node.args]
            return self.limit(FUNCTIONS[node.func.id](*args))  # type: ignore[attr-defined]
        raise self.fail(f"{type(node).__name__} is not allowed")  # _check makes this unreachable


def evaluate(text: str, env: Mapping[str, object]) -> object:
    """Evaluate ``text`` in the safe language with the names in ``env``; raise ExprError."""
    tree = _parse(text)
    try:
        return _Evaluator(text, env).run(tree.body)
    except ExprError:
        raise
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise ExprError(f"cannot evaluate {text!r}: {exc}") from None
    except RecursionError:
        raise ExprError(f"expression {text!r} is too deeply nested") from None
