"""`parascale` command line: one subcommand per module, each exposing ``register(subparsers)``.

A subcommand's ``register`` adds its parser and sets ``func(args) -> int`` as the default.
Bad input anywhere becomes one line on stderr and exit code 2, never a traceback. SIGTERM is
handled like Ctrl-C (workers stopped, a study left resumable), then one line and exit code 143.
Only the subcommand asked for is imported (``report`` alone pulls in matplotlib, about a
second), and ``--version`` imports none.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import parascale
from parascale.errors import KnownFailure, UsageError, WorkerFailure
from parascale.interrupts import EXIT_CODE as TERMINATED_CODE
from parascale.interrupts import Terminated, sigterm_interrupts
from parascale.runtime.processes import exit_now, warm

# name and module path of each subcommand, in the order --help lists them
SUBCOMMANDS = {
    "train": "parascale.cli.train_cmd",
    "run": "parascale.cli.run_cmd",
    "bench": "parascale.cli.bench_cmd",
    "demo": "parascale.cli.demo_cmd",
    "report": "parascale.cli.report_cmd",
    "comm": "parascale.cli.comm_cmd",
    "find-batch": "parascale.cli.find_batch_cmd",
    "hpo": "parascale.cli.hpo_cmd",
    "slurm": "parascale.cli.slurm_cmd",
    "predict": "parascale.cli.predict_cmd",
    "advise": "parascale.cli.advise_cmd",
}
# the subcommands that start workers
LAUNCHING = {"train", "run", "bench", "demo", "comm", "find-batch", "hpo", "advise"}


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print just the error, on one line."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def _wanted(argv: list[str]) -> list[str]:
    """The subcommand modules this command line needs: the one named, none for --version, or
    all (for --help, and to name the valid ones after a typo)."""
    named = next((a for a in argv if not a.startswith("-")), None)
    if named in SUBCOMMANDS:
        return [SUBCOMMANDS[named]]
    if named is None and "--version" in argv:
        return []
    return list(SUBCOMMANDS.values())


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the subcommands ``argv`` needs (all of them without ``argv``)."""
    parser = OneLineParser(
        prog="parascale",
        description="Train a PyTorch model with data parallelism on N CPU cores, GPUs or nodes, "
        "and measure how well it scales.",
    )
    parser.add_argument("--version", action="version", version=f"parascale {parascale.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in (list(SUBCOMMANDS.values()) if argv is None else _wanted(argv)):
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. Called without ``argv`` (as the program itself), it
    leaves at once once its output is flushed: Python's own clean-up after importing torch took
    2-7 s on a loaded 2-core machine, time a finished, stopped or failed job should not cost."""
    standalone = argv is None
    if standalone and _launches(sys.argv[1:]):
        warm()  # first: building the parser imports torch (2.5-3.5 s), the server's import overlaps
    with sigterm_interrupts():
        code = _main(sys.argv[1:] if standalone else argv)
    if standalone:
        exit_now(code)
    return code


def _launches(argv: list[str]) -> bool:
    """Whether this command line starts workers: then a fresh process starts the fork server
    before anything else. (In-process callers, a study or a test, keep the one they started.)"""
    from parascale.runtime.env import external_launcher

    return bool(argv) and argv[0] in LAUNCHING and not {"-h", "--help"} & set(argv) \
        and external_launcher() is None


def _main(argv: list[str]) -> int:
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except UsageError as exc:
        from parascale.runtime.env import speaks

        if speaks():  # under torchrun/srun, rank 0 says it for all: every rank found the same
            print(f"parascale: error: {exc}", file=sys.stderr)
        return 2
    except (WorkerFailure, KnownFailure) as exc:  # KnownFailure: a rank under torchrun/srun
        print(f"parascale: failed: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and the like: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Terminated:
        print("parascale: terminated (SIGTERM)", file=sys.stderr)
        return TERMINATED_CODE
    except KeyboardInterrupt:
        print("parascale: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
