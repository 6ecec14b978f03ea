"""``parascale train``: one data-parallel training run, a thin layer over ``parascale.train``."""
from __future__ import annotations

import argparse
import datetime

from parascale.cli.options import add_train_options, config_from_args

DESCRIPTION = """\
Train a model with synchronous data parallelism on N CPU worker processes (--workers, default
one per core), on GPUs (--gpus 0,1,2,3), or as one rank of a world started by torchrun or srun.
Give the per-device batch (--batch-size) or the global batch (--global-batch), not both: the
other is derived and printed at start, with the effective learning rate.

Writes DIR/record.json (the run record: configuration, environment, per-epoch and per-step
measurements; see docs/record.md) and DIR/model.pt (the final state_dict), nothing else.
"""

EXAMPLES = """\
examples:
  parascale train --workers 2 --model smallcnn --dataset digits --epochs 5
  parascale train --gpus 0,1,2,3 --model resnet50 --dataset cifar10 --data-dir data \\
      --image-size 128 --global-batch 1024 --lr 0.1 --lr-scaling linear --base-batch 256
  torchrun --nnodes 2 --nproc-per-node 4 ... -m parascale train --model resnet20 ...
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="train one model with data parallelism and write its run record",
        description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_options(parser)
    parser.set_defaults(func=run)
    return parser


def default_out(cfg: dict) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"runs/{cfg.get('model', 'smallcnn')}-{cfg.get('dataset', 'digits')}-{stamp}"


def run(args: argparse.Namespace) -> int:
    from parascale.errors import WorkerFailure
    from parascale.training import train

    from parascale.runtime import external_launcher
    from parascale.runtime.failure import exit_now

    cfg = config_from_args(args)
    cfg.setdefault("out", default_out(cfg))
    joined = external_launcher() is not None
    record = train(cfg, teardown=not joined)
    if not record:  # a non-zero rank under torchrun/srun: rank 0 reports
        exit_now(0)
    if record["status"] != "ok":
        raise WorkerFailure(f"{record['reason']} (record: {cfg['out']}/record.json)")
    summary = record["summary"]
    tta = record.get("time_to_accuracy")
    print(f"done in {summary['total_time_s']:.1f} s: steady epoch {summary['steady_epoch_time_s']:.3f} s, "
          f"{summary['steady_throughput']:,.0f} samples/s, test accuracy "
          f"{summary['final_test_accuracy']:.2%}")
    if tta:
        print(f"time to {tta['target']:.0%} accuracy: "
              + (f"{tta['elapsed_s']:.1f} s (epoch {tta['epoch']})" if tta["reached"]
                 else "not reached"))
    print(f"record: {cfg['out']}/record.json")
    if joined:  # this process exits now: skip gloo's teardown (see run_worker)
        exit_now(0)
    return 0
