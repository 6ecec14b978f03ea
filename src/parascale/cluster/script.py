"""The Slurm options and the job script rendered from them.

A job script is plain bash a user can read and submit by hand: ``#SBATCH`` lines, the set-up
lines given with ``--setup``, the rendezvous exported for :mod:`parascale.runtime.world` (rank 0
hosts the store on the first node; the port is derived from the job id so every task knows it
without talking), then ``srun`` with one task per device running ``parascale train``.

Every value that reaches a script can only be data: a control character (newline, CR, NUL, ...)
is refused, since no quoting protects a newline in an ``#SBATCH`` line (the rest of the line
becomes a command, and sbatch stops reading directives there); ``#SBATCH`` values are quoted
for sbatch's own parser (:func:`directive`), the command's words with :func:`shlex.quote`. Set-up
lines are the user's own shell by design, one line each.
"""
from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from parascale import safejson, sync
from parascale.record import VERSION
from parascale.config import NAMES
from parascale.errors import UsageError
from parascale.runtime.world import PORT_BASE

# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1)), in ASCII digits: \d
# would also take a fullwidth '５', which sbatch refuses
_TIME_RE = re.compile(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?")
MAX_TIME_DAYS = 365  # more is a typo: Slurm itself reads a huge limit as none at all
# partition and account names: what Slurm accepts in practice, nothing a shell would read
_NAME_RE = re.compile(r"\A[A-Za-z0-9_.+-]{1,64}\Z")
# what ends or hides a line in a script or on a terminal; a tab is plain white space and stays
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# an #SBATCH value made of these needs no quotes (and reads as it always has)
_PLAIN_RE = re.compile(r"[A-Za-z0-9@%+=:,./_-]+")
CONTROL_HINT = "newline, carriage return, NUL and other control characters cannot be data there"


@dataclass
class SlurmOptions:
    """Where and how long a job runs, and the lines that prepare its environment."""

    nodes: int = 1
    gpus_per_node: int | None = None
    cpus_per_task: int = 1
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    setup: list[str] = field(default_factory=list)
    python: str = sys.executable


def _count(text: str) -> int:
    """A count in ASCII digits: int() also reads '５' and '1_0', which no one means here."""
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise argparse.ArgumentTypeError(f"expected a whole number in ASCII digits, got {text!r}")
    return int(text)


def add_options(parser: argparse.ArgumentParser, dry_run: bool = True) -> None:
    """The Slurm options; ``dry_run=False`` where the parser has its own --dry-run."""
    group = parser.add_argument_group("slurm")
    group.add_argument("--nodes", type=_count, default=1, metavar="N",
                       help="nodes per job (default: 1)")
    group.add_argument("--gpus-per-node", type=_count, metavar="G",
                       help="GPUs per node; one task per GPU (default: none, CPU tasks)")
    group.add_argument("--cpus-per-task", type=_count, default=1, metavar="C",
                       help="CPU cores per task, also its torch threads (default: 1)")
    group.add_argument("--time", metavar="LIMIT",
                       help="time limit per job in Slurm's format: M, M:S, H:M:S, D-H, D-H:M "
                       "or D-H:M:S (default: the partition's)")
    group.add_argument("--partition", metavar="NAME", help="partition (default: the cluster's)")
    group.add_argument("--account", metavar="NAME", help="account to charge")
    group.add_argument("--setup", action="append", default=[], metavar="LINE",
                       help="a shell line run before training, e.g. 'module load cuda' or "
                       "'source venv/bin/activate' (repeatable, in order)")
    group.add_argument("--python", default=sys.executable, metavar="PATH",
                       help="the Python the job runs parascale with (default: this one, "
                       f"{sys.executable}); 'python3' after a --setup that activates a venv")
    if dry_run:
        how = group.add_mutually_exclusive_group(required=True)
        how.add_argument("--dry-run", action="store_true",
                         help="print the job script and submit nothing")
        how.add_argument("--submit", action="store_true", help="submit it with sbatch")
    else:
        group.add_argument("--submit", action="store_true",
                           help="write the job scripts into STUDY/slurm/ and submit them with "
                           "sbatch (instead of --dry-run)")
    group.add_argument("--wait", action="store_true",
                       help="with --submit: wait until the job(s) end, then say how they ended")


def options_from_args(args: argparse.Namespace) -> SlurmOptions:
    """The Slurm options, checked: one UsageError naming the first bad one."""
    opts = SlurmOptions(args.nodes, args.gpus_per_node, args.cpus_per_task, args.time,
                        args.partition, args.account, list(args.setup), args.python)
    if opts.nodes < 1:
        raise UsageError(f"--nodes must be 1 or more, got {opts.nodes}")
    if opts.gpus_per_node is not None and opts.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be 1 or more, got {opts.gpus_per_node}")
    if opts.cpus_per_task < 1:
        raise UsageError(f"--cpus-per-task must be 1 or more, got {opts.cpus_per_task}")
    if opts.time is not None:
        time_limit(opts.time)
    for option, name in (("--partition", opts.partition), ("--account", opts.account)):
        if name is not None and not _NAME_RE.match(name):
            raise UsageError(f"{option} {name!r}: expected a name of letters, digits, '_', '.', "
                             "'+' or '-'")
    for line in opts.setup:
        if _CONTROL_RE.search(line):
            raise UsageError(f"--setup {line!r}: one shell line per --setup, without newline, "
                             "NUL or other control characters (repeat --setup for more lines)")
    if not opts.python.strip() or opts.python.startswith("-") or _CONTROL_RE.search(opts.python):
        raise UsageError(f"--python {opts.python!r}: expected a path or command name")
    if getattr(args, "wait", False) and not getattr(args, "submit", False):
        raise UsageError("--wait waits for submitted jobs: use it with --submit")
    return opts


def time_limit(text: str) -> int:
    """``--time`` in seconds; a UsageError unless it is one of sbatch's forms, in ASCII digits,
    more than zero (Slurm reads 0 as no limit) and at most MAX_TIME_DAYS."""
    match = _TIME_RE.fullmatch(text) if len(text) <= 24 else None
    if not match:
        raise UsageError(f"--time {text!r} is not a Slurm time limit; use minutes (30), M:S, "
                         "H:M:S (1:30:00), D-H, D-H:M or D-H:M:S (2-12:00:00) in ASCII digits")
    days, first, second, third = (int(g) if g else None for g in match.groups())
    if days is not None:  # D-H[:M[:S]]
        seconds = days * 86400 + first * 3600 + (second or 0) * 60 + (third or 0)
    elif third is not None:  # H:M:S
        seconds = first * 3600 + second * 60 + third
    else:  # M[:S]
        seconds = first * 60 + (second or 0)
    if seconds == 0:
        raise UsageError(f"--time {text!r} is zero, which Slurm reads as no limit; give at "
                         "least a minute, or leave --time out for the partition's limit")
    if seconds > MAX_TIME_DAYS * 86400:
        raise UsageError(f"--time {text!r} is longer than {MAX_TIME_DAYS} days; give at most "
                         f"{MAX_TIME_DAYS}-00:00:00, or leave --time out for the partition's "
                         "limit")
    return seconds


def control_character(text: str) -> str | None:
    """The first character of ``text`` that no job script can hold as data, or None."""
    found = _CONTROL_RE.search(text)
    return found.group() if found else None


def check_value(value: str, what: str) -> None:
    """A UsageError naming ``what`` (an option, or the value itself) when ``value`` holds a
    control character."""
    char = control_character(value)
    if char is not None:
        raise UsageError(f"{what} {value!r} holds {char!r}, which a Slurm job script cannot "
                         f"carry: {CONTROL_HINT}")


def directive(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line. sbatch reads these lines with its
    own parser, not bash's: a backslash escapes the next character even inside quotes, and an
    unquoted '#' starts a comment; so a value that is not plain goes in double quotes with its
    backslashes and double quotes escaped (which Python's shlex reads back alike)."""
    if _PLAIN_RE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def job_name(text: str) -> str:
    """A job name squeue shows as it is: what is not a letter, digit or ``_.+-`` becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text)[:120]


def layout(workers: int | None, opts: SlurmOptions) -> tuple[int, int]:
    """(nodes, tasks per node) for a run of ``workers`` tasks: one task per GPU with
    --gpus-per-node, else the workers spread evenly over at most --nodes nodes."""
    if opts.gpus_per_node:
        per_node = opts.gpus_per_node
        nodes = math.ceil(workers / per_node) if workers else opts.nodes
        if workers and workers != nodes * per_node:
            raise UsageError(f"{workers} workers do not fill whole nodes of {per_node} GPUs "
                             f"(one task per GPU); use a multiple of {per_node}")
        if nodes > opts.nodes:
            raise UsageError(f"{workers} workers need {nodes} nodes of {per_node} GPUs, but "
                             f"--nodes is {opts.nodes}")
        return nodes, per_node
    workers = workers or opts.nodes
    nodes = min(opts.nodes, workers)
    if workers % nodes:
        raise UsageError(f"{workers} workers cannot be spread evenly over {nodes} nodes; give "
                         f"a multiple of {nodes} workers or fewer --nodes")
    return nodes, workers // nodes


def file_pattern(path) -> str:
    """A path as the start of a Slurm file name pattern (--output): its own '%' doubled, so
    that only the '%j' the caller adds is read as the job id."""
    return str(path).replace("%", "%%")


def train_flags(train: dict[str, Any]) -> list[str]:
    """``parascale train`` options that give the TrainConfig fields and strategy options in
    ``train`` (the inverse of :func:`parascale.cli.options.config_from_args`); ``out`` is left
    to the caller."""
    flags: list[str] = []
    declared = sync.options()
    for name in NAMES:
        if name == "sync_options":  # here --sync's options follow it, as in train's help
            options = {**dict(train.get("sync_options") or {}),
                       **{k: v for k, v in train.items() if k in declared}}
            for key, item in options.items():
                if key in declared and declared[key][0].flag:
                    flags += _flag(key, item)
                else:
                    flags += ["--sync-option", f"{key}={_option_text(item)}"]
        elif name != "out" and train.get(name) is not None:
            flags += _flag(name, train[name])
    return flags


def _flag(key: str, value: Any) -> list[str]:
    name = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [name if value else "--no-" + name[2:]]
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else _text(value)
    # a value that starts with '-' would be read by argparse as an option of its own
    return [f"{name}={text}"] if text.startswith("-") else [name, text]


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _option_text(value: Any) -> str:
    """A --sync-option value that ``parse_value`` reads back as the same value and type."""
    from parascale.bench.values import parse_value

    if isinstance(value, str):
        try:
            if parse_value(value) == value:
                return value
        except ValueError:
            pass
        return safejson.dumps(value)  # '"1"' stays the text 1, not the number
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _text(value)
    return safejson.dumps(value)  # true, false, null, lists and mappings


@dataclass
class Script:
    """One job script: what it is for, the command it trains with, where its output goes."""

    name: str  # --job-name
    what: str  # one comment line saying what the job does
    train: list[str]  # the parascale train options, --out included (run: then the script)
    output: str  # --output file pattern (%j: the job id)
    nodes: int = 1
    tasks_per_node: int = 1
    before: list[str] = field(default_factory=list)  # lines of ours before srun
    after: list[str] = field(default_factory=list)  # lines of ours after srun (code=$? set)
    command: str = "train"  # the parascale command each task runs: train, or run a script


def render(script: Script, opts: SlurmOptions) -> str:
    """The job script's text (bash); a UsageError when a value cannot be written into it as
    data (paths made here from the working folder too, not only what was typed)."""
    q = shlex.quote
    for value in (script.name, script.what, script.output, *script.train, opts.python,
                  *opts.setup, *script.before, *script.after):
        check_value(value, "the value")
    if "\\" in script.output:  # Slurm then expands no %j and drops the backslashes
        raise UsageError(f"{script.output!r}: Slurm cannot name a job's output file by a path "
                         "holding a backslash; choose an --out without one")
    sbatch = [f"--job-name={script.name}", f"--nodes={script.nodes}",
              f"--ntasks-per-node={script.tasks_per_node}",
              f"--cpus-per-task={opts.cpus_per_task}", f"--output={script.output}"]
    if opts.gpus_per_node:
        sbatch.append(f"--gpus-per-node={opts.gpus_per_node}")
    if opts.time:
        sbatch.append(f"--time={opts.time}")
    if opts.partition:
        sbatch.append(f"--partition={opts.partition}")
    if opts.account:
        sbatch.append(f"--account={opts.account}")
    lines = ["#!/bin/bash",
             f"# {' '.join(script.what.split())}",  # one comment line, whatever paths hold
             f"# written by parascale {VERSION}; submit it again with: sbatch FILE"]
    lines += [f"#SBATCH {directive(line)}" for line in sbatch]
    lines += ["#SBATCH --open-mode=append", "",
              "# not -e: a failed run must still be filed with its reason", "set -uo pipefail",
              ""]
    if opts.setup:
        lines += ["# set-up (--setup)", *opts.setup, ""]
    lines += ["# rendezvous: rank 0 hosts the store on the first node; the port comes from the",
              "# job id, so every task knows it without talking"]
    if script.nodes == 1:  # one node: nothing needs to listen beyond loopback
        lines += ["export MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo"]
    else:
        lines += ['MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                  "export MASTER_ADDR"]
    lines += [f"export MASTER_PORT=$(({PORT_BASE} + SLURM_JOB_ID % {PORT_BASE}))",
              f"export OMP_NUM_THREADS={opts.cpus_per_task}", ""]
    lines += script.before
    # srun does not take --cpus-per-task from sbatch since Slurm 22.05: say it again
    command = ["srun", "--kill-on-bad-exit=1", f"--cpus-per-task={opts.cpus_per_task}",
               opts.python, "-m", "parascale", script.command, *script.train]
    lines += [f"# {script.nodes * script.tasks_per_node} task(s): one per "
              f"{'GPU' if opts.gpus_per_node else 'worker'}, each a rank of one world",
              _wrap(" ".join(q(part) for part in command)), "code=$?"]
    lines += script.after
    lines += ["exit $code", ""]
    return "\n".join(lines)


def _wrap(command: str, width: int = 96) -> str:
    """A long command broken before its options, with backslashes, so it reads."""
    parts, line, out = shlex.split(command), "", []
    for part in parts:
        token = shlex.quote(part)
        if line and part.startswith("--") and len(line) + len(token) > width:
            out.append(line + " \\")
            line = "    " + token
        else:
            line = f"{line} {token}" if line else token
    out.append(line)
    return "\n".join(out)
