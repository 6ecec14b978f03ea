"""``parascale find-batch``: the largest per-device batch that fits, and what it gives on N devices."""
from __future__ import annotations

import argparse
import math
import textwrap
from typing import Any

from parascale import safejson, sync
from parascale.batchfind.largest import SHARE_OF_FREE, gib, largest
from parascale.cli.options import key_value
from parascale.checks import path_option
from parascale.digits import INT_RE, ascii_float, ascii_int, int_list
from parascale.errors import UsageError

DESCRIPTION = """\
Find the largest per-device batch of a model and data set, or of a --task (its own model, data,
collate and loss), that fits in memory: the batch doubles until a probe fails, then the search
bisects between the last that fitted and the first that did not. Every probe runs two real
training steps (forward, backward, SGD with momentum or the task's optimizer) in a process of its
own, which is then gone. On a GPU (--gpus) a probe fails with CUDA's out-of-memory error; on the
CPU, when its peak resident memory is over the budget (--memory-limit; default half the memory
free now), and a probe whose peak, extrapolated from the smaller ones, would be over the budget
is not started at all. Prints the largest batch, its peak memory, and the global batch and
learning rate it gives on 1, 2, 4, ... devices.

{sharded}
"""
SHARDED = """With --sync S, each probe is two real training steps on --workers N processes (default 2;
or the --gpus listed) with that strategy, so the batch is the one that fits its memory layout:
sharded state leaves room for a larger batch ({sharding}; the default, {default}, to compare).
On the CPU --memory-limit is each worker's budget (default half the memory free now, over the
workers)."""
MAX_DEVICES = 10 ** 7


def parse_memory(text: str) -> int:
    """'4GB', '4G', '512MiB', '1.5G' -> bytes (powers of 1024), as --device-memory reads them."""
    from parascale.runtime.memory_cap import SIZE_WORDS, read_size

    size = read_size(text)
    if size is None:
        raise argparse.ArgumentTypeError(f"expected {SIZE_WORDS}, got {text!r}")
    return size


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "find-batch", help="find the largest per-device batch that fits in memory",
        description=DESCRIPTION.format(sharded=textwrap.fill(" ".join(SHARDED.format(
            sharding=_sharding(), default=sync.DEFAULT).split()), 96)),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", metavar="NAME", help="a model of the registry (or --task)")
    parser.add_argument("--task", metavar="MODULE:FUNCTION",
                        help="a user's task (docs/tasks.md): each probe builds its model and "
                        "runs its loss on the first items of its own training data, collated "
                        "as in training, with its optimizer (else SGD with momentum)")
    parser.add_argument("--dataset", default="digits", metavar="NAME")
    parser.add_argument("--data-dir", metavar="DIR", type=path_option("--data-dir"))
    parser.add_argument("--image-size", type=ascii_int, metavar="S")
    parser.add_argument("--gpus", type=_gpu_ids, metavar="ID[,ID...]",
                        help="search on this CUDA device (with --sync: these devices)")
    parser.add_argument("--sync", metavar="S",
                        help="train each probe on --workers N with this strategy's memory layout "
                        f"(one of {', '.join(sync.names())}; {_sharding()}) (default: one "
                        "process, unsharded)")
    parser.add_argument("--sync-option", type=key_value, action="append", metavar="KEY=VALUE",
                        help="the strategy's option, as train's --sync-option takes it")
    parser.add_argument("--workers", type=ascii_int, metavar="N",
                        help="with --sync on the CPU: the workers each probe trains on "
                        "(default 2)")
    parser.add_argument("--memory-limit", type=parse_memory, metavar="SIZE",
                        help="the CPU budget, e.g. 4GB (default: half the memory free now)")
    parser.add_argument("--max-batch", type=ascii_int, default=1 << 16, metavar="B",
                        help="stop there (default 65536; at most the training set)")
    parser.add_argument("--lr", type=ascii_float, default=0.05,
                        help="the learning rate at the found batch, for the table (default 0.05)")
    parser.add_argument("--lr-scaling", choices=("linear", "sqrt", "none"), default="linear",
                        help="how the table scales the rate with the global batch")
    parser.add_argument("--devices", default="1,2,4,8", metavar="N,...",
                        help="device counts for the table (default 1,2,4,8)")
    parser.add_argument("--out", metavar="FILE", type=path_option("--out"), help="also write the result as JSON here")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import psutil

    from parascale import data, models
    from parascale.batch import resolve_lr
    from parascale.config import TrainConfig
    from parascale.validation import validate
    from parascale.files import atomic_write_text

    # the learning rate and the GPU go through training's own checks: the same words as train
    if (args.model is None) == (args.task is None):
        raise UsageError("find-batch: give --model NAME (a model of the registry) or --task "
                         "package.module:function, one of them")
    workers = _workers(args)
    cfg = TrainConfig.of(model=args.model or "smallcnn", dataset=args.dataset,
                         data_dir=args.data_dir, task=args.task,
                         image_size=args.image_size, lr=args.lr, lr_scaling=args.lr_scaling,
                         gpus=args.gpus, sync=args.sync,
                         sync_options=dict(args.sync_option or []),
                         workers=workers if args.gpus is None else None)
    validate(cfg)
    if cfg.job.task is None:  # a task is loaded and tried once before the search (largest)
        models.check(cfg.job.model)
        data.check(cfg)
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be a positive integer, got {args.max_batch}")
    devices = _devices(args.devices)
    if args.gpus is not None and args.memory_limit is not None:
        raise UsageError("--memory-limit is the CPU's budget; on a GPU the device's memory is "
                         "the limit: leave one out")
    # the table's rate on the most devices: --lr 1e308 would print inf after the whole search
    if not math.isfinite(resolve_lr(args.lr, args.lr_scaling, max(devices), 1)):
        raise UsageError(f"--lr {args.lr:g} scaled {args.lr_scaling} to {max(devices)} devices "
                         "is beyond a float; give a learning rate such as 0.05")
    if args.gpus is not None:
        from parascale.runtime import resolve_device_type

        resolve_device_type(cfg.processes.device, cfg.processes.gpus, "leave out --gpus to "
                            "search on the CPU (--memory-limit sets its budget)")
    if args.out:
        _check_out(args.out)
    share = workers or 1
    budget = None if args.gpus is not None else \
        args.memory_limit or int(SHARE_OF_FREE * psutil.virtual_memory().available / share)
    found, device, limit = largest(
        cfg, None if args.gpus is None else args.gpus[0], budget, args.max_batch,
        "" if args.memory_limit else " (half the memory free now"
        + (f", over {share} workers)" if share > 1 else ")"), workers=workers)
    best = found.best
    if best is None:
        print("not even a batch of 1 fits" + (f" in {gib(budget)}" if budget else ""))
        return 1
    capped = " (the limit: every batch up to it fits)" if best.batch == limit else ""
    print(f"largest per-device batch: {best.batch}{capped}, peak {gib(best.peak_bytes)}; "
          f"{sum(p.ran for p in found.probes)} probes run")
    print(f"  devices  global batch  learning rate ({args.lr_scaling} from {args.lr:g} at "
          f"batch {best.batch})")
    table = []
    for n in devices:
        lr = resolve_lr(args.lr, args.lr_scaling, n * best.batch, best.batch)
        table.append({"devices": n, "global_batch": n * best.batch, "lr": lr})
        print(f"  {n:>7}  {n * best.batch:>12}  {lr:g}")
    if args.out:
        what: dict[str, Any] = {"task": cfg.job.task} if cfg.job.task else \
            {"model": cfg.job.model, "dataset": cfg.data.dataset}
        if workers is not None:
            what.update(sync=cfg.strategy.sync, sync_options=cfg.strategy.sync_options,
                        workers=workers)
        result = {**what, "device": device,
                  "budget_bytes": budget, "batch": best.batch, "peak_bytes": best.peak_bytes,
                  "limit": limit, "probes": [p.__dict__ for p in found.probes], "table": table}
        from pathlib import Path

        atomic_write_text(Path(args.out), safejson.dumps(result, indent=1))
    return 0


def _sharding() -> str:
    """'zero shards the optimizer state; fsdp shards ...': what each sharding strategy shards."""
    words = {"params": "the parameters", "grads": "the gradients", "state": "the optimizer state"}
    said = [f"{name} shards {', '.join(words[k] for k in sync.SHARDABLE if k in shards)}"
            for name in sync.names() if (shards := sync.traits_of(name).shards)]
    return "; ".join(said) or "no strategy shards"


def _gpu_ids(text: str) -> tuple[int, ...]:
    return int_list(text, "GPU ids such as 0 or 0,1")


def _workers(args: argparse.Namespace) -> int | None:
    """The workers each probe trains on (None: today's one-process probe), checked."""
    if args.gpus == ():
        raise UsageError("--gpus: expected GPU ids such as 0 or 0,1, got none")
    gpus = args.gpus or ()
    if args.sync is None:
        given = "--workers" if args.workers is not None else \
            "--sync-option" if args.sync_option else "two --gpus" if len(gpus) > 1 else None
        if given:
            raise UsageError(f"find-batch: {given} belongs to a search under a strategy; give "
                             f"--sync {'|'.join(sync.names())} too (without it, one process on "
                             "one device is searched)")
        return None
    if gpus and args.workers is not None:
        raise UsageError("find-batch: with --gpus the workers are the GPUs listed; leave out "
                         "--workers")
    workers = len(gpus) if gpus else (2 if args.workers is None else args.workers)
    if workers < 2:
        raise UsageError(f"find-batch --sync {args.sync} needs 2 or more workers, got {workers}: "
                         "on one nothing is sharded (leave out --sync to search one process)")
    return workers


def _devices(text: str) -> list[int]:
    devices = [int(n) for n in text.split(",")] \
        if all(INT_RE.fullmatch(n.strip()) for n in text.split(",")) else []
    if not devices or any(not 1 <= n <= MAX_DEVICES for n in devices):
        raise UsageError(f"--devices: expected device counts from 1 to {MAX_DEVICES:,} such as "
                         f"1,2,4, got {text!r}")
    return devices


def _check_out(out: str) -> None:
    """Before the search, not after it: --out names a file, in a folder that can take it."""
    from pathlib import Path

    from parascale.files import check_writable_folder

    if Path(out).is_dir():
        raise UsageError(f"--out {out} is a folder; give a file name such as "
                         f"{Path(out) / 'find-batch.json'}")
    check_writable_folder(Path(out).parent, "--out")
