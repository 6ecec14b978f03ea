"""``parascale find-batch``: the largest per-device batch that fits, and what it gives on N devices."""
from __future__ import annotations

import argparse
import json
import re
import tempfile

from parascale.errors import UsageError

DESCRIPTION = """\
Find the largest per-device batch of a model and data set that fits in memory: the batch doubles
until a probe fails, then the search bisects between the last that fitted and the first that did
not. Every probe runs two real training steps (forward, backward, SGD with momentum) in a process
of its own, which is then gone. On a GPU (--gpus) a probe fails with CUDA's out-of-memory error;
on the CPU, when its peak resident memory is over the budget (--memory-limit; default half the
memory free now), and a probe whose peak, extrapolated from the smaller ones, would be over the
budget is not started at all. Prints the largest batch, its peak memory, and the global batch and
learning rate it gives on 1, 2, 4, ... devices.
"""
SHARE_OF_FREE = 0.5  # the CPU budget without --memory-limit: of the memory available now
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)


def parse_memory(text: str) -> int:
    """'4GB', '4G', '512MiB', '1.5G' -> bytes (powers of 1024)."""
    match = _SIZE.fullmatch(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a size such as 4G, 512MiB or 1.5GB, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "find-batch", help="find the largest per-device batch that fits in memory",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="NAME")
    parser.add_argument("--dataset", default="digits", metavar="NAME")
    parser.add_argument("--data-dir", metavar="DIR")
    parser.add_argument("--image-size", type=int, metavar="S")
    parser.add_argument("--gpus", type=int, metavar="ID", help="search on this CUDA device")
    parser.add_argument("--memory-limit", type=parse_memory, metavar="SIZE",
                        help="the CPU budget, e.g. 4GB (default: half the memory free now)")
    parser.add_argument("--max-batch", type=int, default=1 << 16, metavar="B",
                        help="stop there (default 65536; at most the training set)")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="the learning rate at the found batch, for the table (default 0.05)")
    parser.add_argument("--lr-scaling", choices=("linear", "sqrt", "none"), default="linear",
                        help="how the table scales the rate with the global batch")
    parser.add_argument("--devices", default="1,2,4,8", metavar="N,...",
                        help="device counts for the table (default 1,2,4,8)")
    parser.add_argument("--out", metavar="FILE", help="also write the result as JSON here")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import psutil

    from parascale import data, models
    from parascale.batch import resolve_lr
    from parascale.config import TrainConfig, validate
    from parascale.files import atomic_write_text, check_writable_folder

    cfg = TrainConfig(model=args.model, dataset=args.dataset, data_dir=args.data_dir,
                      image_size=args.image_size)
    validate(cfg)
    models.check(cfg.model)
    data.check(cfg)
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be a positive integer, got {args.max_batch}")
    try:
        devices = [int(n) for n in args.devices.split(",")]
    except ValueError:
        raise UsageError(f"--devices: expected counts such as 1,2,4, got {args.devices!r}")
    if args.gpus is not None and args.memory_limit is not None:
        raise UsageError("--memory-limit is the CPU's budget; on a GPU the device's memory is "
                         "the limit: leave one out")
    if args.out:
        from pathlib import Path

        check_writable_folder(Path(args.out).parent)
    budget = None if args.gpus is not None else \
        args.memory_limit or int(SHARE_OF_FREE * psutil.virtual_memory().available)
    found, device, limit = largest(cfg, args.gpus, budget, args.max_batch,
                                   "" if args.memory_limit else " (half the memory free now)")
    best = found.best
    if best is None:
        print("not even a batch of 1 fits" + (f" in {_gib(budget)}" if budget else ""))
        return 1
    capped = " (the limit: every batch up to it fits)" if best.batch == limit else ""
    print(f"largest per-device batch: {best.batch}{capped}, peak {_gib(best.peak_bytes)}; "
          f"{sum(p.ran for p in found.probes)} probes run")
    print(f"  devices  global batch  learning rate ({args.lr_scaling} from {args.lr:g} at "
          f"batch {best.batch})")
    table = []
    for n in devices:
        lr = resolve_lr(args.lr, args.lr_scaling, n * best.batch, best.batch)
        table.append({"devices": n, "global_batch": n * best.batch, "lr": lr})
        print(f"  {n:>7}  {n * best.batch:>12}  {lr:g}")
    if args.out:
        result = {"model": cfg.model, "dataset": cfg.dataset, "device": device,
                  "budget_bytes": budget, "batch": best.batch, "peak_bytes": best.peak_bytes,
                  "limit": limit, "probes": [p.__dict__ for p in found.probes], "table": table}
        from pathlib import Path

        atomic_write_text(Path(args.out), json.dumps(result, indent=1))
    return 0


def largest(cfg, gpu: int | None, budget: int | None, max_batch: int, why: str = ""):
    """Search ``cfg``'s model and data (already checked) on GPU ``gpu`` or on the CPU within
    ``budget``, printing each probe; (the search, the device, the limit)."""
    from parascale import batchfind, data

    facts = data.prepare(cfg)
    device = "cpu" if gpu is None else f"cuda:{gpu}"
    where = f"GPU {gpu}" if gpu is not None else f"CPU, budget {_gib(budget)}{why}"
    shape = "x".join(map(str, facts["input_shape"]))
    print(f"parascale find-batch: {cfg.model} on {cfg.dataset} ({shape}), {where}", flush=True)
    limit = min(max_batch, facts["train"])
    task = {"model": cfg.model, "num_classes": facts["num_classes"],
            "input_shape": list(facts["input_shape"]), "device": device, "budget": budget}
    with tempfile.TemporaryDirectory(prefix="parascale-probe-") as folder:
        found = batchfind.search(batchfind.probe_in_child(task, folder), budget, limit=limit,
                                 report=_show)
    return found, device, limit


def _show(probe) -> None:
    if not probe.ran:
        print(f"  batch {probe.batch:>6}: {probe.reason}", flush=True)
        return
    peak = f", peak {_gib(probe.peak_bytes)}" if probe.peak_bytes else ""
    over = " (over the budget)" if "over the budget" in probe.reason else \
        f" ({probe.reason})" if probe.reason else ""
    print(f"  batch {probe.batch:>6}: {'fits' if probe.fits else 'does not fit'}{peak}{over}",
          flush=True)


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.2f} GiB"
