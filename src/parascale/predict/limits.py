"""The ranges a prediction's inputs must lie in, from the command line or from a record.

A record is input from anywhere (a hand edit, another program): ``bytes_per_step: 1e308`` ended
in an OverflowError, negative step times printed negative compute and throughput, and an
infinite ``--noise-scale`` wrote ``Infinity`` (invalid JSON) into prediction.json. Every figure
is checked here first, and one out of range is refused in one line naming where it came from.
The bounds are generous (far beyond any machine) and only keep the arithmetic finite and the
printed figures short.
"""
from __future__ import annotations

import math
from typing import Any

from parascale.errors import UsageError

MAX_SECONDS = 1e6  # a step of eleven days
MAX_BYTES = 1e15  # a petabyte exchanged per step
MAX_COUNT = 10 ** 7  # devices, servers, samples per batch, steps between averages
MAX_SAMPLES = 1e12  # a gradient noise scale
MIN_GIB, MAX_GIB = 1e-3, 1e6  # a device's memory: a MiB to a petabyte


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, a bool, NaN, ±inf, or an integer
    too large for a float)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def within(value: Any, low: float, high: float) -> bool:
    found = number(value)
    return found is not None and low <= found <= high


def option(name: str, value: Any, low: float, high: float, what: str) -> None:
    """Refuse ``--name value`` unless it is a finite number from ``low`` to ``high``."""
    if value is not None and not within(value, low, high):
        shown = f"{value:g}" if isinstance(value, float) else _shown(value)
        raise UsageError(f"--{name} must be {what} from {low:g} to {high:g}, got {shown}")


def workers(counts: Any) -> None:
    """Refuse ``--workers`` unless every count is a whole number from 1 to :data:`MAX_COUNT`."""
    if not counts or any(not 1 <= n <= MAX_COUNT for n in counts):
        shown = ",".join(map(str, counts or ()))
        shown = shown if len(shown) <= 40 else shown[:40] + "…"
        raise UsageError(f"--workers {shown or '(empty)'}: worker counts must be positive "
                         f"integers up to {MAX_COUNT:,}, e.g. 1,2,4,8")


def field(where: Any, path: str, value: Any, low: float, high: float, unit: str) -> float:
    """``value`` of field ``path`` in the record at ``where``, or one line refusing it."""
    if not within(value, low, high):
        raise UsageError(f"{where}: {path} is {_shown(value)}; predict needs a finite number "
                         f"from {low:g} to {high:g} {unit}")
    return float(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}…({len(text)} characters)"

