"""``parascale train``: one data-parallel training run, a thin layer over ``parascale.train``."""
from __future__ import annotations

import argparse
import os
import sys

from parascale.cli.options import config_from_args
from parascale.cli.parsers import train_parser
from parascale.run_summary import busy_warning, default_out, done_lines, process_start


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = train_parser(subparsers)
    parser.set_defaults(func=run)
    return parser


def _speaks() -> bool:
    """Rank 0 of a torchrun/srun world, or a local launch (read from the environment: the
    runtime module would import torch, which is what takes the first seconds)."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


def run(args: argparse.Namespace) -> int:
    command_start = process_start()
    cfg = config_from_args(args)
    if cfg.get("resume") and "out" not in cfg:  # the default --out is a new folder each time
        from parascale.errors import UsageError

        raise UsageError("--resume needs --out: the folder of the run to continue")
    cfg.setdefault("out", default_out(cfg))
    if _speaks():  # before torch is imported: that alone takes seconds
        print("parascale: checking the configuration and data...", flush=True)
    from parascale.errors import WorkerFailure
    from parascale.runtime import external_launcher
    from parascale.runtime.processes import exit_now
    from parascale.training import train

    joined = external_launcher() is not None
    record = train(cfg, teardown=not joined, command_start=command_start)
    if not record:  # a non-zero rank under torchrun/srun: rank 0 reports
        exit_now(0)
    if record["status"] != "ok":
        raise WorkerFailure(f"{record['reason']} (record: {cfg['out']}/record.json)")
    tta = record.get("time_to_accuracy")
    print("\n".join(done_lines(record)))
    if tta:
        print(f"time to {tta['target']:.0%} accuracy: "
              + (f"{tta['elapsed_s']:.1f} s (epoch {tta['epoch']})" if tta["reached"]
                 else "not reached"))
    print(f"record: {cfg['out']}/record.json", flush=True)
    warning = busy_warning(record.get("machine"))
    if warning:
        print(warning, file=sys.stderr)
    if joined:  # leave now, skipping gloo's teardown (see run_worker); cli.main does it otherwise
        exit_now(0)
    return 0
