"""``parascale report``: tables, plots and one HTML page from run records, never re-running anything.

Public API:

- :func:`load_records` reads STUDY folders or record files into records plus problems;
  :func:`load_studies` does too, and sets apart the runs a study folder's plan.json does not list;
- :func:`summary_rows` turns records into table rows (pure; see :mod:`.tables` for every formula);
- :func:`format_terminal` prints them;
- :func:`write_report` writes report.html, summary.csv, summary.md and the plots (PNG and SVG),
  each file atomically, and returns the path of report.html.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from parascale.report.load import Loaded, Problem, RunRecord, load_records
from parascale.report.outputs import (default_out_dir, load_studies, terminal_summary,
                                      write_loaded, write_report)
from parascale.report.rows import Row, summary_rows
from parascale.report.tables import format_terminal

if TYPE_CHECKING:
    from parascale.report.plots import Plot

__all__ = ["Loaded", "Problem", "Row", "RunRecord", "Plot", "default_out_dir", "format_terminal",
           "load_records", "load_studies", "summary_rows", "write_report", "write_loaded",
           "terminal_summary"]


def __getattr__(name: str):
    """``Plot``, from its module on first use: it imports matplotlib (a second), which reading
    records, ``predict`` and the command line's errors do without."""
    if name == "Plot":
        from parascale.report.plots import Plot

        return Plot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
