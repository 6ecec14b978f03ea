"""`parascale` command line: one subcommand per module, each exposing ``register(subparsers)``.

A subcommand's ``register`` adds its parser and sets ``func(args) -> int`` as the default.
Bad input anywhere becomes one line on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from parascale.errors import KnownFailure, UsageError, WorkerFailure

# module path of each subcommand, in the order --help lists them
SUBCOMMANDS = [
    "parascale.cli.train_cmd",
    "parascale.cli.bench_cmd",
    "parascale.cli.demo_cmd",
    "parascale.report.command",
    "parascale.cli.comm_cmd",
]


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print just the error, on one line."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="parascale",
        description="Train a PyTorch model with data parallelism on N CPU cores, GPUs or nodes, "
        "and measure how well it scales.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # subcommand not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"parascale: error: {exc}", file=sys.stderr)
        return 2
    except (WorkerFailure, KnownFailure) as exc:  # KnownFailure: a rank under torchrun/srun
        print(f"parascale: failed: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and the like: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("parascale: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
