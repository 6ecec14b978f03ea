"""How much does parascale's trainer cost over a minimal hand-written DDP loop?

Same model (smallcnn), same data (scikit-learn digits, the same 1,437 training samples), same
per-device batch, same worker count, gloo on CPU, one thread per worker. The two are run in
alternation (A B, B A, ...) so that drifting machine load hits both alike, and each run reports
its steady throughput: samples over the slowest rank's epoch time, median over epochs after the
first (warm-up). The figure is parascale / hand-written, per round and as the median of rounds.

    .venv/bin/python benchmarks/trainer_overhead.py [--rounds 5] [--epochs 8] [--batch 32]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parascale.runtime.local import open_store


def hand_worker(rank: int, world: int, port: int, epochs: int, batch: int, queue) -> None:
    """The loop a careful user would write by hand: DDP, a shared permutation, rank slices."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # the parent hosts the store on loopback (runtime.local.open_store): a tcp:// init_method
    # would have rank 0's TCPStore listen on every interface
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, is_master=False),
                            rank=rank, world_size=world)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from parascale.models import build

    digits = load_digits()
    x, _, y, _ = train_test_split(digits.images, digits.target, test_size=360,
                                  stratify=digits.target, random_state=0)
    x = torch.tensor(x, dtype=torch.float32).unsqueeze(1) / 16
    x = (x - x.mean()) / x.std()
    y = torch.tensor(y)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build("smallcnn", 10, (1, 8, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    global_batch = batch * world
    steps = len(x) // global_batch
    throughputs = []
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        start = time.perf_counter()
        for s in range(steps):
            idx = order[s * global_batch + rank * batch:s * global_batch + (rank + 1) * batch]
            loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        took = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        throughputs.append(steps * global_batch / float(took))
    if rank == 0:
        queue.put(statistics.median(throughputs[1:]))
    dist.barrier()  # gloo can abort a rank whose peer tears down first
    dist.destroy_process_group()


def run_hand(world: int, epochs: int, batch: int) -> float:
    store = open_store()  # loopback only, on a port the kernel picks
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(hand_worker, args=(world, store.port, epochs, batch, queue),
                       nprocs=world, start_method="spawn")
    return queue.get()


def run_parascale(world: int, epochs: int, batch: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "parascale", "train", "--model", "smallcnn",
                        "--dataset", "digits", "--workers", str(world), "--batch-size",
                        str(batch), "--epochs", str(epochs), "--lr", "0.05", "--no-save-model",
                        "--out", out], check=True, stdout=subprocess.DEVNULL)
        return json.loads(Path(out, "record.json").read_text())["summary"]["steady_throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="per-device batch")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    ratios, ours, hands = [], [], []
    for r in range(args.rounds):
        order = ("hand", "parascale") if r % 2 == 0 else ("parascale", "hand")
        got = {}
        for name in order:
            run = run_hand if name == "hand" else run_parascale
            got[name] = run(args.workers, args.epochs, args.batch)
        ours.append(got["parascale"])
        hands.append(got["hand"])
        ratios.append(got["parascale"] / got["hand"])
        print(f"round {r + 1}: hand-written {got['hand']:,.0f} samples/s, parascale "
              f"{got['parascale']:,.0f} samples/s, ratio {ratios[-1]:.3f}", flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    print(f"\nmedian ratio parascale / hand-written: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}, n={len(ratios)} rounds); "
          f"medians {statistics.median(ours):,.0f} vs {statistics.median(hands):,.0f} samples/s")
    print(f"machine: {cpu}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"{args.workers} workers x batch {args.batch}, {args.epochs} epochs per run")


if __name__ == "__main__":
    main()
