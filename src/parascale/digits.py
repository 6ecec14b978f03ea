"""Numbers typed by a user, in ASCII digits only.

Python's ``int``, ``float``, ``str.isdigit`` and the regular expression ``\\d`` all accept any
Unicode decimal digit ('５', '٣', '३') and ``int``/``float`` also take '1_0'. No one means a
fullwidth or Arabic-Indic digit as a count on this tool's command line, and a value that only
looks like a number in one script but is read as another is how a wrong run starts; so every
number parascale reads from a user goes through here and is refused, in one line, otherwise.
"""
from __future__ import annotations

import argparse
import re

INT_RE = re.compile(r"[+-]?[0-9]+")
FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|nan)",
                      re.IGNORECASE)


def is_count(text: str) -> bool:
    """Whether ``text`` is a non-negative whole number in ASCII digits (no sign, no '_')."""
    return isinstance(text, str) and text.isascii() and text.isdigit()


def ascii_int(text: str) -> int:
    """An argparse type: like ``int`` but ASCII digits only (an optional sign, spaces around)."""
    if not INT_RE.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"expected a whole number in ASCII digits (0-9), "
                                         f"got {text!r}")
    return int(text)


def ascii_float(text: str) -> float:
    """An argparse type: like ``float`` but ASCII digits only ('0.05', '1e-3', '5')."""
    if not FLOAT_RE.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"expected a number in ASCII digits such as 0.05 or "
                                         f"1e-3, got {text!r}")
    return float(text)


def ascii_type(kind: type) -> object:
    """The ASCII-only parser for ``kind`` when it is int or float, else ``kind`` itself."""
    return {int: ascii_int, float: ascii_float}.get(kind, kind)


def int_list(text: str, what: str = "integers such as 0,1") -> tuple[int, ...]:
    """'0,1,3' -> (0, 1, 3), empty items skipped; an argparse type error naming ``what``
    unless every item is a whole number in ASCII digits."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not all(INT_RE.fullmatch(v) for v in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated {what} in ASCII digits, "
                                         f"got {text!r}")
    return tuple(int(v) for v in items)
