"""How much does parascale's trainer cost over a plain hand-written loop?

Same model (default lenet, the built-in model with the fewest parameters), same data
(scikit-learn digits, the same 1,437 training samples), same per-device batch (32), same worker
count (default 1), one thread per worker. With one worker the hand-written loop is the plainest
one: forward, loss, zero_grad, backward, step over a shuffled, pre-normalised tensor (no process
group); with more, DDP over gloo. The two are run in alternation (A B, B A, ...) so that drifting
machine load hits both alike, and each run reports its steady throughput: samples over the
slowest rank's epoch time, median over the epochs after the first (warm-up), and its best
epoch's. The figure is parascale / hand-written, per round and as the median of rounds; the
ratio of best epochs is printed beside it, since on a shared machine other processes can only
slow an epoch down, and the fastest one is the least disturbed. Beside the wall-clock figures,
the same ratio by CPU time (samples over the largest rank's process CPU time in the epoch, the
record's ``cpu_time_s_per_rank``): an epoch here is ~50 ms, so on a loaded machine one lost
time slice moves its wall time by a fifth, while its CPU time counts only the process's own work.
Like parascale by default, the hand-written loop evaluates the test split after every epoch,
outside the timed steps (evaluation leaves the allocator and caches in another state for the
next epoch's first steps: both sides pay that alike).

    .venv/bin/python benchmarks/trainer_overhead.py [--rounds 7] [--epochs 8] [--batch 32]
        [--workers 1] [--model lenet]
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


def hand_worker(rank: int, world: int, port: int, epochs: int, batch: int, model_name: str,
                queue) -> None:
    """The loop a careful user would write by hand: a shared permutation, rank slices, and
    DDP only where there is more than one rank."""
    torch.set_num_threads(1)
    if world > 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # the parent hosts the store on loopback (runtime.local.open_store): a tcp:// init_method
        # would have rank 0's TCPStore listen on every interface
        dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, is_master=False),
                                rank=rank, world_size=world)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from parascale.models import build

    digits = load_digits()
    x, x_test, y, y_test = train_test_split(digits.images, digits.target, test_size=360,
                                            stratify=digits.target, random_state=0)
    x = torch.tensor(x, dtype=torch.float32).unsqueeze(1) / 16
    x_test = (torch.tensor(x_test, dtype=torch.float32).unsqueeze(1) / 16 - x.mean()) / x.std()
    y_test = torch.tensor(y_test)
    x = (x - x.mean()) / x.std()
    y = torch.tensor(y)
    torch.manual_seed(0)
    model = build(model_name, 10, (1, 8, 8))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    global_batch = batch * world
    steps = len(x) // global_batch
    throughputs, by_cpu = [], []
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        start, cpu = time.perf_counter(), time.process_time()
        for s in range(steps):
            idx = order[s * global_batch + rank * batch:s * global_batch + (rank + 1) * batch]
            loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        took = torch.tensor([time.perf_counter() - start, time.process_time() - cpu])
        if world > 1:
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        throughputs.append(steps * global_batch / float(took[0]))
        by_cpu.append(steps * global_batch / float(took[1]))
        evaluate(model, x_test, y_test)
    if rank == 0:
        queue.put((statistics.median(throughputs[1:]), max(throughputs[1:]),
                   statistics.median(by_cpu[1:])))
    if world > 1:
        dist.barrier()  # gloo can abort a rank whose peer tears down first
        dist.destroy_process_group()


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Test accuracy in batches of 256, as parascale evaluates after each epoch."""
    model.eval()
    with torch.no_grad():
        right = sum(int((model(x[i:i + 256]).argmax(1) == y[i:i + 256]).sum())
                    for i in range(0, len(x), 256))
    model.train()
    return right / len(x)


def run_hand(world: int, epochs: int, batch: int, model: str) -> tuple[float, float, float]:
    store = open_store()  # loopback only, on a port the kernel picks
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(hand_worker, args=(world, store.port, epochs, batch, model, queue),
                       nprocs=world, start_method="spawn")
    return queue.get()


def run_parascale(world: int, epochs: int, batch: int,
                  model: str) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "parascale", "train", "--model", model,
                        "--dataset", "digits", "--workers", str(world), "--batch-size",
                        str(batch), "--epochs", str(epochs), "--lr", "0.05", "--no-save-model",
                        "--threads", "1", "--out", out], check=True, stdout=subprocess.DEVNULL)
        record = json.loads(Path(out, "record.json").read_text())
        steady = [e for e in record["epochs"] if not e["warmup"]]
        by_cpu = [e["samples"] / max(e["cpu_time_s_per_rank"]) for e in steady]
        return (record["summary"]["steady_throughput"], max(e["throughput"] for e in steady),
                statistics.median(by_cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="per-device batch")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--model", default="lenet")
    args = parser.parse_args()
    ratios, best_ratios, cpu_ratios, ours, hands = [], [], [], [], []
    for r in range(args.rounds):
        order = ("hand", "parascale") if r % 2 == 0 else ("parascale", "hand")
        got = {}
        for name in order:
            run = run_hand if name == "hand" else run_parascale
            got[name] = run(args.workers, args.epochs, args.batch, args.model)
        ours.append(got["parascale"][0])
        hands.append(got["hand"][0])
        ratios.append(got["parascale"][0] / got["hand"][0])
        best_ratios.append(got["parascale"][1] / got["hand"][1])
        cpu_ratios.append(got["parascale"][2] / got["hand"][2])
        print(f"round {r + 1}: hand-written {got['hand'][0]:,.0f} samples/s, parascale "
              f"{got['parascale'][0]:,.0f} samples/s, ratio {ratios[-1]:.3f} (best epochs "
              f"{got['hand'][1]:,.0f} vs {got['parascale'][1]:,.0f}: {best_ratios[-1]:.3f}); "
              f"by CPU time {got['hand'][2]:,.0f} vs {got['parascale'][2]:,.0f} samples per "
              f"CPU-second: {cpu_ratios[-1]:.3f}", flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"\nmedian ratio parascale / hand-written: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}, n={len(ratios)} rounds); "
          f"medians {statistics.median(ours):,.0f} vs {statistics.median(hands):,.0f} samples/s")
    print(f"median ratio of the best epochs: {statistics.median(best_ratios):.3f} "
          f"(min {min(best_ratios):.3f}, max {max(best_ratios):.3f})")
    print(f"median ratio by CPU time: {statistics.median(cpu_ratios):.3f} "
          f"(min {min(cpu_ratios):.3f}, max {max(cpu_ratios):.3f})")
    print(f"machine: {cpu}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"{args.model}, {args.workers} worker(s) x batch {args.batch}, {args.epochs} epochs per "
          f"run; load average before the last round {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
