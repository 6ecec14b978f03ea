"""``parascale train``: one data-parallel training run, a thin layer over ``parascale.train``."""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

from parascale.cli.options import add_train_options, config_from_args

DESCRIPTION = """\
Train a model with synchronous data parallelism on N CPU worker processes (--workers, default
one per core), on GPUs (--gpus 0,1,2,3), or as one rank of a world started by torchrun or srun.
Give the per-device batch (--batch-size) or the global batch (--global-batch), not both: the
other is derived and printed at start, with the effective learning rate.

Writes DIR/record.json (the run record: configuration, environment, per-epoch and per-step
measurements; see docs/record.md), DIR/model.pt (the final state_dict) and DIR/log.txt (what
the run printed), nothing else; with --checkpoint-every also DIR/checkpoints/, from which
--resume continues and --max-restarts restarts (docs/checkpoints.md).
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


def process_start() -> float:
    """When this process started, as a ``time.time()`` value. psutil's ``create_time`` adds a
    boot time that Linux gives in whole seconds (measured 0.28 s off here); the process's age
    on the boot-time clock is exact to a clock tick."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        import psutil

        return psutil.Process().create_time()


def _speaks() -> bool:
    """Rank 0 of a torchrun/srun world, or a local launch (read from the environment: the
    runtime module would import torch, which is what takes the first seconds)."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


def done_lines(record: dict) -> list[str]:
    """The command's wall time beside the training time, and where the steady figures are from."""
    summary, timing = record["summary"], record.get("timing")
    if timing:
        took = (f"done in {timing['command_s']:.1f} s (start-up {timing['startup_s']:.1f} s, "
                f"training {timing['training_s']:.1f} s)")
    else:  # under torchrun/srun the launcher's start is not ours to know
        took = f"done: training {summary['total_time_s']:.1f} s"
    accuracy = summary["final_test_accuracy"]
    lines = [f"{took}: steady epoch {summary['steady_epoch_time_s']:.3f} s, "
             f"{summary['steady_throughput']:,.0f} samples/s"
             + (f", test accuracy {accuracy:.2%}" if accuracy is not None else "")]
    how = "" if summary["steady_epoch_time_method"] == "epochs" else \
        (f"; no full epoch after the warm-up, so the epoch time is the mean step time x "
         f"{record['derived']['steps_per_epoch']} steps")
    lines.append(f"  steady figures from {summary['steady_source']}{how}")
    return lines


def busy_warning(machine: dict | None) -> str | None:
    """One line when other programs competed for the CPUs while the run trained."""
    if not machine or not machine["busy"]:
        return None
    host = max(machine["hosts"], key=lambda h: h["other_cores"] + h["steal_cores"])
    where = f" on {host['host']}" if len(machine["hosts"]) > 1 else ""
    load = f"other processes used {host['other_cores']:.2f} of {host['cores']} cores"
    if host["steal_cores"] >= 0.01:
        load += f" and the hypervisor took {host['steal_cores']:.2f}"
    top = host["top_others"]
    if top:
        command = " ".join(top[0]["command"].split())[:60]  # one line, whatever argv held
        biggest = f"; the biggest: pid {top[0]['pid']}, {top[0]['cores']:.2f} cores ({command})"
    else:  # the load came from processes that did not last the whole window
        biggest = "; no single process stood out"
    return (f"parascale: warning: the CPUs were busy while this run trained{where}: {load} "
            f"on average{biggest}; its times are slower than a quiet machine's")


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
