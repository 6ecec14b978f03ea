"""``parascale run [options] script.py [script args]``: N copies of a user's training script,
launched, measured and recorded as ``train``'s workers are (docs/scripts.md)."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
from pathlib import Path

from parascale import sync
from parascale.cli.options import add_train_options, config_from_args, flag, sync_help
from parascale.errors import UsageError
from parascale.script.options import taken


DESCRIPTION = """\
Start N copies of your own training script (--workers N, default one per core; or --gpus
0,1,...), each a rank of one data-parallel job, or join the world of torchrun or srun. The
script calls parascale's small API (import parascale.script; docs/scripts.md): its steps are
measured on every rank and rank 0 writes DIR/record.json, the same run record as 'parascale
train', which 'report' and 'predict' read, with DIR/model.pt and DIR/log.txt. Everything
after the script's path is the script's: parascale's own options go before it (write -- after
the script when it takes an option of the same name).
"""

EXAMPLES = """\
examples:
  parascale run --workers 2 examples/digits_parascale.py --batch-size 16
  parascale run --workers 4 --sync local-sgd --period 8 --out runs/mine train.py --epochs 3
  torchrun --nproc-per-node 2 -m parascale run --out runs/tr train.py
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run", help="launch your own training script on N workers and record how it scaled",
        description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from parascale.config import TrainConfig

    add_train_options(parser, exclude=({f.name for f in dataclasses.fields(TrainConfig)}
                                       | set(sync.options())) - set(taken()))
    for action in parser._actions:
        if action.dest == "sync":  # the trainer's list names strategies a script cannot run
            action.help = sync_help(sync.with_trait(script_refusal=None)) + \
                " The others need parascale's own training step."
    # one REMAINDER for the script and its arguments: argparse keeps a '--' inside it (it drops
    # the one that follows a positional of its own, which script_args must see)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="script.py ...",
                        help="the training script to run, then its own arguments")
    parser.set_defaults(func=run)
    return parser


def script_args(script: Path, args: list[str]) -> list[str]:
    """The script's arguments; one that is an option of ``run`` itself is refused, since the
    user more likely meant it for parascale (``--`` first passes everything as it is)."""
    if args[:1] == ["--"]:
        return args[1:]
    ours = {flag(name) for name in taken() if name != "sync_options"} | \
        {"--sync-option", "--no-oversubscribe"}
    for arg in args:
        name = arg.partition("=")[0]
        if name in ours:
            raise UsageError(f"{name} comes after {script.name}, so it would go to the script, "
                             f"not to parascale: give parascale's options before the script, "
                             f"or write -- after {script.name} to pass {name} to the script")
    return args


def script_and_args(command: list[str]) -> tuple[Path, list[str]]:
    """The script and its arguments from what follows run's own options (``slurm run`` too)."""
    from parascale.script.launch import checked_script

    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("give the script to run: parascale run [options] script.py [its "
                         "arguments]")
    script = checked_script(command[0])
    return script, script_args(script, command[1:])


def run(args: argparse.Namespace) -> int:
    from parascale.cli.train_cmd import process_start

    command_start = process_start()
    script, argv = script_and_args(list(args.command))
    given = config_from_args(args)
    if "out" not in given:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        given["out"] = f"runs/{script.stem}-{stamp}"
    return _launch(given, script, argv, command_start)


def _launch(given: dict, script: Path, argv: list[str], command_start: float) -> int:
    import sys

    from parascale.errors import WorkerFailure
    from parascale.run_summary import busy_warning, done_lines
    from parascale.runtime import external_launcher
    from parascale.script.launch import checked, launch_script

    cfg, size = checked(given)
    if external_launcher():
        if cfg.device_memory is not None:
            raise UsageError(f"--device-memory caps the copies parascale starts itself, not "
                             f"{external_launcher()}'s; leave it out under a launcher")
        return _joined(cfg, script, argv)
    record = launch_script(cfg, size, script, argv, ("process start", command_start))
    if record["status"] != "ok":
        raise WorkerFailure(f"{record['reason']} (record: {cfg.out}/record.json)")
    print("\n".join(done_lines(record)))
    print(f"record: {cfg.out}/record.json", flush=True)
    if warning := busy_warning(record.get("machine")):
        print(warning, file=sys.stderr)
    return 0


def launcher_name() -> str:
    from parascale.runtime import external_launcher

    return external_launcher() or "local"


def _joined(cfg, script: Path, argv: list[str]) -> int:
    """Under torchrun or srun this process is one copy: it runs the script itself, and rank 0
    writes the record into --out."""
    import os

    from parascale.runtime import contract
    from parascale.runtime.env import speaks
    from parascale.runtime.processes import exit_now
    from parascale.script.launch import spec
    from parascale.script.running import run_script

    if speaks():  # rank 0 writes; the others' default --out may differ by a second
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        from parascale.record import LOG_NAME
        from parascale.training.observe.console import ConsoleLog

        log = ConsoleLog(Path(cfg.out) / LOG_NAME, fresh=True)
        log.line(f"--- parascale run {script.name}, {launcher_name()} launch ---")
        log.close()
        os.environ[contract.LOG] = str(log.path)
    os.environ[contract.SCRIPT] = spec(cfg, script, argv)
    run_script(str(script), argv)
    exit_now(0)  # skipping gloo's teardown, as train does under a launcher
    return 0
