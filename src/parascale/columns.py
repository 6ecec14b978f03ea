"""Plain-text tables for the terminal (search trials, Slurm jobs): torch- and plot-free."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def aligned(rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` (the header first) as lines of columns two spaces apart, each padded to its
    widest cell but the last, which runs free (a note, a reason); no trailing spaces."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) + "  "
                      + str(row[-1])).rstrip() for row in rows)
