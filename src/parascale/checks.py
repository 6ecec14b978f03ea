"""Checks of one value against a type or a range, in the words every refusal uses.

Shared by the configuration (:mod:`parascale.config`, a field's annotation) and the strategies'
options (:mod:`parascale.sync.options`, a declared kind), so that both refuse a value in the same
words and neither reaches into the other. Nothing here imports another parascale layer.
"""
from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, TypeGuard, cast

from parascale.errors import UsageError


def is_int(value: Any) -> TypeGuard[int]:
    """An int that is not a bool (True is an int to Python, never a count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def expected(kind: Any) -> tuple[str, Callable[[Any], bool]]:
    """What a value of ``kind`` is, in words, and the test of a value (int is not bool; a float
    field takes an int; a tuple field takes a list or tuple of ints)."""
    if kind is bool:
        return "true or false", lambda v: isinstance(v, bool)
    if kind is int:
        return "an integer", is_int
    if kind is float:
        return "a number", lambda v: is_int(v) or isinstance(v, float)
    if kind is str:
        return "a string", lambda v: isinstance(v, str)
    if typing.get_origin(kind) is tuple:  # the length is validate's business (C,H,W)
        return "a list of integers", \
            lambda v: isinstance(v, (list, tuple)) and all(is_int(x) for x in v)
    if typing.get_origin(kind) is dict:
        return "a mapping", lambda v: isinstance(v, dict)
    if typing.get_origin(kind) is typing.Union:  # a count or a word (learners: 4 or "auto")
        parts = [expected(k) for k in typing.get_args(kind)]
        return " or ".join(words for words, _ in parts), \
            lambda v: any(fits(v) for _, fits in parts)
    raise TypeError(f"no type check for {kind!r}: teach parascale.checks.expected about it")


def positive(name: str, value: Any, allow_none: bool = True, kind: type = int) -> None:
    """Refuse anything but a positive ``kind`` (None too, unless ``allow_none``), naming the
    option as its flag."""
    if value is None and allow_none:
        return
    if not isinstance(value, kind) or isinstance(value, bool) or cast(float, value) <= 0:
        raise UsageError(f"--{name.replace('_', '-')} must be a positive {kind.__name__}, "
                         f"got {value!r}")


def path_given(value: str, option: str) -> str:
    """``value`` of a folder or file option, or one line when it is empty or only spaces: an
    empty --out wrote nowhere (the record 'in /record.json') or into the working folder, and
    an empty --tensorboard was silently off."""
    if not value.strip():
        raise UsageError(f"{option} {value!r} is empty: give a folder or file name, e.g. "
                         f"{option} runs/first")
    return value


def path_option(option: str) -> Callable[[str], str]:
    """The argparse type of a path option: the text, or :func:`path_given`'s one line."""
    return lambda text: path_given(text, option)
