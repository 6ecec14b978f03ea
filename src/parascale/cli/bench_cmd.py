"""``parascale bench``: plan a scaling study, run every configuration, summarise and report."""
from __future__ import annotations

import argparse
import dataclasses

from parascale.bench.session import dry_run, execute, explain, plan_from_args, typed_command
from parascale.cli.options import config_from_args
from parascale.cli.parsers import bench_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = bench_parser(subparsers)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    inputs, jobs, study = plan_from_args(args, config_from_args(args))
    explain(args, jobs)
    if args.dry_run:
        dry_run(jobs, study, inputs.repeat, args.rerun)
        return 0
    return execute(study, jobs, args.rerun, dataclasses.asdict(inputs), typed_command("bench"),
                   args.quiet_machine)
