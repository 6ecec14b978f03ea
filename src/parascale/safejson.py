"""JSON in and out: reading what other programs wrote (bounded size, nesting and strings,
checked types), and writing strict JSON that any parser reads.

A run record is read by ``report`` and by a resumed ``bench`` (and its ``--dry-run``), and it may
come from anywhere: a copy off another machine, a hand edit, a hostile file. ``json.loads`` alone
turns 200 KB of brackets into a RecursionError, and a 200,000-character model name travels on
into tables and plots. Here every document is refused, with a one-line reason, unless it is at
most :data:`MAX_BYTES` long, nested at most :data:`MAX_DEPTH` deep and holds no string longer
than :data:`MAX_CHARS`; :func:`check_types` checks a document against a type spec (a run
record's is :data:`parascale.record.RUN_RECORD`). Nothing here imports torch, so ``report``
stays light.

Every file parascale writes, and every JSON value it hands to another process, goes through
:func:`dumps`: strict JSON (``allow_nan=False``), since ``NaN`` and ``Infinity`` are not JSON
and other languages' parsers refuse a file that holds them. A non-finite number inside an
object becomes ``null``, and the object gains :data:`NONFINITE`, a map from where the number
was (its key, or ``key/3`` for an item of a list under it, as a JSON Pointer relative to the
object) to what it was: ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (docs/record.md).
"""
from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from typing import Any

__all__ = ["Refused", "MAX_BYTES", "MAX_DEPTH", "MAX_CHARS", "NONFINITE", "load", "loads",
           "dumps", "finite", "check_shape", "check_types", "read_plan"]

NONFINITE = "nonfinite"
"""The key beside non-finite numbers written as null: where each was, and what it was."""

MAX_BYTES = 32 * 2**20  # a record of 1,000 epochs on 64 ranks is about 2 MB
MAX_DEPTH = 64  # a record nests 4 deep; study parameters may add a few levels
MAX_CHARS = 10_000  # model names, reasons, paths; the planner's own string limit is the same
MAX_PLAN_BYTES = 256 * 2**20  # a study's plan.json: up to 100,000 runs with their parameters


class Refused(ValueError):
    """A document that is not read, and why. ``kind`` is ``unreadable`` (not JSON, or beyond a
    limit) or ``invalid`` (JSON, but not the document expected)."""

    def __init__(self, reason: str, kind: str = "unreadable"):
        super().__init__(reason)
        self.kind = kind


def load(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
         max_chars: int = MAX_CHARS) -> Any:
    """The JSON document in the file ``path``, within the limits; :class:`Refused` otherwise."""
    try:
        # non-blocking: a FIFO named record.json must not stop the reader; it is refused below
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise Refused("not a regular file")
            raw = handle.read(max_bytes + 1)  # never more than the limit, whatever the file is
    except OSError as exc:
        raise Refused(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise Refused(f"larger than {max_bytes:,} bytes (the limit for a JSON document)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(f"not UTF-8 text: {exc}") from None
    return loads(text, max_depth=max_depth, max_chars=max_chars)


def loads(text: str, *, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS) -> Any:
    """:func:`json.loads` within the depth and string limits; :class:`Refused` otherwise."""
    try:
        data = json.loads(text)
    except RecursionError:  # far deeper than max_depth: json's own recursion gave up first
        raise Refused(f"nested more than {max_depth} levels deep (the limit)") from None
    except ValueError as exc:
        raise Refused(f"{type(exc).__name__}: {exc}") from None  # JSONDecodeError: Expecting...
    check_shape(data, max_depth=max_depth, max_chars=max_chars)
    return data


def dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False,
          default: Callable[[Any], Any] | None = None) -> str:
    """``value`` as strict JSON: :func:`json.dumps` with ``allow_nan=False`` after
    :func:`finite`. A non-finite number outside any object (the document itself, or an item of
    a list that is the document) has nowhere to say what it was: ``ValueError``."""
    return json.dumps(finite(value), indent=indent, sort_keys=sort_keys, default=default,
                      allow_nan=False)


def _spelled(number: float) -> str:
    """The name JavaScript (and Python's own parser) gives a non-finite number."""
    return "NaN" if number != number else ("Infinity" if number > 0 else "-Infinity")


def _pointer(key: Any) -> str:
    """``key`` as a JSON Pointer reference token (RFC 6901: ``~`` as ``~0``, ``/`` as ``~1``)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def finite(value: Any) -> Any:
    """``value`` with every non-finite float inside an object ``None``, and that object's
    :data:`NONFINITE` saying where each was and what; ``value`` itself when it holds none
    (nothing is copied then). Lists inside lists are named by their indices (``rows/2/0``)."""
    if isinstance(value, dict):
        notes: dict[str, str] = {}
        changed: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(item, float) and not math.isfinite(item):
                changed[key], notes[_pointer(key)] = None, _spelled(item)
            elif isinstance(item, (dict, list, tuple)):
                clean = _items(item, _pointer(key), notes) if not isinstance(item, dict) \
                    else finite(item)
                if clean is not item:
                    changed[key] = clean
        if not changed:
            return value
        out = {key: changed.get(key, item) for key, item in value.items()}
        if notes:
            given = out.get(NONFINITE)
            out[NONFINITE] = {**given, **notes} if isinstance(given, dict) else notes
        return out
    if isinstance(value, (list, tuple)):
        return _items(value, None, None)
    return value


def _items(items: list | tuple, where: str | None, notes: dict[str, str] | None) -> Any:
    """A list's items made finite; a non-finite number among them is noted at ``where/i`` in
    the object holding the list (``notes``), or left for json to refuse when there is none."""
    out: list[Any] | None = None
    for i, item in enumerate(items):
        clean = item
        if isinstance(item, float) and not math.isfinite(item) and notes is not None:
            clean, notes[f"{where}/{i}"] = None, _spelled(item)
        elif isinstance(item, dict):
            clean = finite(item)
        elif isinstance(item, (list, tuple)):
            clean = _items(item, None if where is None else f"{where}/{i}", notes)
        if clean is not item and out is None:
            out = list(items[:i])
        if out is not None:
            out.append(clean)
    return items if out is None else out


def check_shape(data: Any, *, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS) -> None:
    """Refuse nesting deeper than ``max_depth`` and strings (values or keys) longer than
    ``max_chars``, walking without recursion (so that it cannot overflow the stack itself)."""
    def path(parent: str, key: Any) -> str:  # built only for containers and messages
        if key is None:
            return parent
        if isinstance(key, int) and not isinstance(key, bool):
            return f"{parent}[{key}]"
        return f"{parent}.{str(key)[:40]}" if parent else str(key)[:40]

    stack: list[tuple[Any, int, str, Any]] = [(data, 1, "", None)]  # value, depth, where, key
    while stack:
        value, depth, parent, key = stack.pop()
        if isinstance(value, str):
            if len(value) > max_chars:
                raise Refused(f"a string of {len(value):,} characters at "
                              f"{path(parent, key) or 'the top'} (the limit is {max_chars:,})")
        elif isinstance(value, (dict, list)):
            where = path(parent, key)
            if depth > max_depth:
                shown = where if len(where) <= 60 else where[:57] + "..."
                raise Refused(f"nested more than {max_depth} levels deep at {shown} (the limit)")
            if isinstance(value, dict):
                for name, item in value.items():
                    if isinstance(name, str) and len(name) > max_chars:
                        raise Refused(f"a key of {len(name):,} characters in {where or 'the top'}"
                                      f" (the limit is {max_chars:,})")
                    stack.append((item, depth + 1, where, name))
            else:
                stack.extend((item, depth + 1, where, i) for i, item in enumerate(value))


def _kind(expected: Any) -> str:
    if isinstance(expected, dict):
        return "an object"
    if isinstance(expected, list):
        return "a list"
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    return " or ".join(dict.fromkeys(names[t] for t in expected))


def check_types(data: Any, spec: Any, where: str = "") -> None:
    """Raise :class:`Refused` (kind ``invalid``) where ``data`` has a type ``spec`` does not allow.

    ``None`` is accepted everywhere; booleans are not numbers.
    """
    stack = [(data, spec, where)]
    while stack:
        value, expected, path = stack.pop()
        if value is None:
            continue
        if isinstance(expected, dict):
            ok = isinstance(value, dict)
        elif isinstance(expected, list):
            ok = isinstance(value, list)
        else:
            ok = isinstance(value, expected) and (bool in expected or not isinstance(value, bool))
        if not ok:
            raise Refused(f"{path or 'the document'} is {type(value).__name__}, expected "
                          f"{_kind(expected)}", "invalid")
        if isinstance(expected, dict):
            stack.extend((value.get(k), sub, f"{path}.{k}" if path else k)
                         for k, sub in expected.items())
        elif isinstance(expected, list):
            stack.extend((item, expected[0], f"{path}[{i}]") for i, item in enumerate(value))


def read_plan(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A study's ``plan.json`` (an object whose ``runs`` is a list), or :class:`Refused`. It is
    ``parascale bench``'s own file, but a study folder may come from anywhere, like a record."""
    data = load(path, max_bytes=MAX_PLAN_BYTES)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise Refused("not a parascale study plan (no list of runs)", "invalid")
    return data
