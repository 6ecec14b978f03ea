"""``parascale run [options] script.py [script args]``: N copies of a user's training script,
launched, measured and recorded as ``train``'s workers are (docs/scripts.md)."""
from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from parascale.cli.options import config_from_args
from parascale.cli.parsers import run_parser, script_and_args
from parascale.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = run_parser(subparsers)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from parascale.run_summary import process_start

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
        if cfg.processes.device_memory is not None:
            raise UsageError(f"--device-memory caps the copies parascale starts itself, not "
                             f"{external_launcher()}'s; leave it out under a launcher")
        return _joined(cfg, script, argv)
    record = launch_script(cfg, size, script, argv, ("process start", command_start))
    if record["status"] != "ok":
        raise WorkerFailure(f"{record['reason']} (record: {cfg.output.out}/record.json)")
    print("\n".join(done_lines(record)))
    print(f"record: {cfg.output.out}/record.json", flush=True)
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
        Path(cfg.output.out).mkdir(parents=True, exist_ok=True)
        from parascale.record import LOG_NAME
        from parascale.training.observe.console import ConsoleLog

        log = ConsoleLog(Path(cfg.output.out) / LOG_NAME, fresh=True)
        log.line(f"--- parascale run {script.name}, {launcher_name()} launch ---")
        log.close()
        os.environ[contract.LOG] = str(log.path)
    os.environ[contract.SCRIPT] = spec(cfg, script, argv)
    run_script(str(script), argv)
    exit_now(0)  # skipping gloo's teardown, as train does under a launcher
    return 0
