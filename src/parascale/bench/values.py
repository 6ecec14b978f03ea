"""Values as the command line gives them (``-P name=value``, ``-V name=v1,v2``, a training
option's text): numbers, booleans, null, JSON, else text; shared by bench, hpo and slurm. Also
what a study's names may be, and the error every part of planning raises."""
from __future__ import annotations

import re
from typing import Any

from parascale import safejson
from parascale.bench import safeyaml
from parascale.errors import UsageError
from parascale.safejson import Refused

NAME_RE = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*\Z")
# re.ASCII: \d would take '５' and '٣', and int()/float() would read them as numbers
_INT_RE = re.compile(r"[+-]?\d+\Z", re.ASCII)
_FLOAT_RE = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?\Z", re.ASCII)


class PlanError(UsageError):
    """A study cannot be planned: bad syntax, unknown name, reference cycle, bad extension."""


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_value(text: str) -> Any:
    """A command-line value: int, float, true/false, null, JSON string/list/mapping, else text."""
    s = text.strip()
    try:
        if _INT_RE.match(s):
            return int(s)
        if _FLOAT_RE.match(s):
            return float(s)
        if s.lower() in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[s.lower()]
        if s[:1] in ('"', "[", "{"):  # DLBS habit: -P 'model="resnet50"'
            return safejson.loads(s, max_depth=safeyaml.MAX_DEPTH)  # as deep as a study file
    except ValueError as exc:  # safejson.Refused included
        raise PlanError(f"bad value {_cut(text)!r}: {exc}") from None
    return s


def parse_assignment(text: str) -> tuple[str, Any]:
    """``-P name=value`` into (name, parsed value)."""
    name, sep, value = text.partition("=")
    if not sep or not NAME_RE.match(name.strip()):
        raise PlanError(f"bad parameter {text!r}: expected name=value, e.g. batch_size=32")
    try:
        return name.strip(), parse_value(value)
    except PlanError as exc:
        raise PlanError(f"bad parameter {_cut(text)!r}: {exc}; expected name=value") from None


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes, so '$(max(1,2))$' stays one value."""
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return items + [text[start:]]


def parse_variable(text: str) -> tuple[str, list[Any]]:
    """``-V name=v1,v2,v3`` or ``-V name=[v1, v2]`` (JSON) into (name, values)."""
    expected = "expected name=v1,v2,... or name=[v1, v2, ...]"
    name, sep, rest = text.partition("=")
    if not sep or not NAME_RE.match(name.strip()):
        raise PlanError(f"bad variable {text!r}: {expected}")
    rest = rest.strip()
    if rest.startswith("["):
        try:
            values = safejson.loads(rest, max_depth=safeyaml.MAX_DEPTH)
        except Refused as exc:  # not JSON, or too deep
            raise PlanError(f"bad variable {_cut(text)!r}: invalid JSON list ({exc}); "
                            f"{expected}") from None
    else:
        items = _split_top_level(rest)
        if any(not item.strip() for item in items):
            raise PlanError(f"bad variable {text!r}: empty value; {expected}")
        try:
            values = [parse_value(item) for item in items]
        except PlanError as exc:
            raise PlanError(f"bad variable {text!r}: {exc}; {expected}") from None
    if not isinstance(values, list) or not values:
        raise PlanError(f"bad variable {text!r}: needs at least one value; {expected}")
    return name.strip(), values
