"""`parascale` command line: one subcommand per module, each exposing ``register(subparsers)``.

A subcommand's ``register`` adds its parser and sets ``func(args) -> int`` as the default.
Bad input anywhere becomes one line on stderr and exit code 2, never a traceback. Only the
subcommand asked for is imported (``report`` alone pulls in matplotlib, about a second), and
``--version`` imports none.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import parascale
from parascale.errors import UsageError, WorkerFailure

# name and module path of each subcommand, in the order --help lists them
SUBCOMMANDS = {
    "train": "parascale.cli.train_cmd",
    "bench": "parascale.cli.bench_cmd",
    "demo": "parascale.cli.demo_cmd",
    "report": "parascale.report.command",
    "comm": "parascale.cli.comm_cmd",
}


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
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # subcommand not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; ``argv`` None means this process's own command line (``standalone``:
    a subcommand may then leave with ``os._exit`` once its output is out)."""
    standalone = argv is None
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
        args.standalone = standalone
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"parascale: error: {exc}", file=sys.stderr)
        return 2
    except WorkerFailure as exc:
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
