"""``parascale report``: argument parsing and printing; the work is in :mod:`parascale.report`."""
from __future__ import annotations

import argparse
from pathlib import Path

from parascale.checks import path_given
from parascale.digits import ascii_float
from parascale.errors import UsageError
from parascale.files import check_writable_folder
from parascale.report import default_out_dir, load_studies, terminal_summary, write_loaded

DESCRIPTION = """\
Read the run records of one or more studies (never re-running anything) and write report.html
(one self-contained page), summary.csv, summary.md and plots (PNG and SVG) into DIR.

STUDY is a study folder (runs/<config>/record.json), a 'parascale train --out' folder
(record.json), a folder of such folders, or a record.json file. Several STUDY arguments are
overlaid as separate series. Failed, out-of-memory, skipped and unreadable runs are listed with
their reasons; a study folder's runs that its plan.json does not list (an earlier plan's) are
listed as such and left out of the tables. Speedup S = N_ref*X_N/X_ref (X = global samples/s,
reference = 1 worker or the smallest N), efficiency E = S/N, never capped at 100%.
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``report`` to the parascale command line."""
    parser = subparsers.add_parser(
        "report", help="tables, plots and an HTML page from the run records of studies",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("studies", nargs="+", type=Path, metavar="STUDY",
                        help="study folder, train --out folder, or record.json file")
    parser.add_argument("--out", type=lambda text: Path(path_given(text, "--out")),
                        metavar="DIR", default=None,
                        help="where to write the report (default: the first STUDY's report/ folder)")
    parser.add_argument("--target", type=ascii_float, metavar="FRACTION", default=None,
                        help="time-to-accuracy for every run at this test accuracy (0.9 for 90%%): "
                        "the training time of the first evaluation that reached it, read from "
                        "the run's recorded curve, never interpolated between evaluations or "
                        "extrapolated beyond the last; 'not reached' otherwise (default: each "
                        "run's own --target-accuracy, if it had one); --target 0.9 is "
                        "--target-metric accuracy --target-value 0.9")
    parser.add_argument("--target-metric", metavar="NAME", default=None,
                        help="time-to-target on any metric the records hold, in its direction "
                        "(at most the value for a lower-is-better one such as loss), as train "
                        "takes it: with --target-value, e.g. --target-metric loss "
                        "--target-value 1.9")
    parser.add_argument("--target-value", type=ascii_float, metavar="V", default=None,
                        help="the value of --target-metric to reach")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Load first (bad input raises UsageError with nothing written), then write and print."""
    loaded = load_studies(args.studies, _target(args))
    out_dir = args.out or default_out_dir(args.studies[0])
    check_writable_folder(out_dir, "--out" if args.out else "the report folder")
    html = write_loaded(loaded, out_dir)
    print(terminal_summary(loaded))
    print()
    print(f"report: {html}")
    return 0


def _target(args: argparse.Namespace) -> float | tuple[str, float] | None:
    """--target (a test accuracy) or --target-metric with --target-value, checked."""
    if args.target is not None and args.target_metric is not None:
        raise UsageError("report: give --target or --target-metric, not both (--target 0.9 is "
                         "--target-metric accuracy --target-value 0.9)")
    if (args.target_metric is None) != (args.target_value is None):
        raise UsageError("report: --target-metric and --target-value go together, e.g. "
                         "--target-metric loss --target-value 1.9")
    if args.target_metric is not None:
        if args.target_metric == "accuracy" and not 0 < args.target_value <= 1:
            raise UsageError(f"report: an accuracy target is a fraction in (0, 1], got "
                             f"{args.target_value:g}")
        return args.target_metric, args.target_value
    if args.target is not None and not 0 < args.target <= 1:
        raise UsageError(f"report: --target is a fraction in (0, 1] (0.9 for 90%), got "
                         f"{args.target:g}")
    return args.target
