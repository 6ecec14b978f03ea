"""What does parascale.script's API cost per step, against the same loop without it?

The loop of examples/digits_plain.py (an MLP on scikit-learn's digits, batch 32, SGD with
momentum, one thread): A is the plain loop over a shuffled DataLoader; B is the same loop made a
parascale script (run.shard, run.setup, run.backward, the optimizer's step through the run) in a
world of one, recording every epoch as ``parascale run --workers 1`` does (the epoch's
collectives and the machine's CPU counters, read once per epoch); C is B as a plain process
(``python script.py``: the steps timed, no record kept). A, B and C take turns, one epoch each,
in an order that rotates every round, in one process, so that drifting machine load hits all
alike; each epoch's throughput is samples over its wall time, and, since on a shared machine
one lost time slice moves a 0.1 s epoch by a tenth, also over its process CPU time. The figures
are B / A and C / A: the median epoch's throughput ratio, and the best epochs' (other processes
can only slow an epoch down). The goal is at least 0.97. A digits epoch is 44 steps of about
0.5 ms: the per-epoch costs weigh here as they never do on a real epoch. Like with like: the
run stops if the sides' epochs step through different numbers of samples; and it counts the
profiler ranges (``record_function``) each side opens per step, to show that the API opens
none of its own beside the DataLoader's and the optimizer's.

    .venv/bin/python benchmarks/script_api.py [--rounds 20] [--batch 32]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from digits_plain import data  # noqa: E402  (the example's own data)

import parascale.script as ps  # noqa: E402


def model_and_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)


def epoch(loader, model, optimizer, backward) -> tuple[float, float, int]:
    """One pass: (wall s, CPU s, samples)."""
    samples = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for x, y in loader:
        optimizer.zero_grad()
        backward(nn.functional.cross_entropy(model(x), y))
        optimizer.step()
        samples += len(x)
    return time.perf_counter() - wall, time.process_time() - cpu, samples


PHASES = ("next batch", "zero_grad", "forward", "backward", "optimizer step")


def phased_epoch(loader, model, optimizer, backward, steps: list, ends: list) -> None:
    """One pass, each call of the loop timed on its own (wall): where a side's extra time goes.
    The pass's first batch (the sampler's permutation; the API's epoch start) and the call
    that ends it (the API's epoch entry) are kept apart from the steps."""
    clock = time.perf_counter
    t0 = clock()
    batches = iter(loader)
    x, y = next(batches)
    first = clock() - t0
    while True:
        t1 = clock()
        optimizer.zero_grad()
        t2 = clock()
        loss = nn.functional.cross_entropy(model(x), y)
        t3 = clock()
        backward(loss)
        t4 = clock()
        optimizer.step()
        t5 = clock()
        try:
            x, y = next(batches)
        except StopIteration:
            ends.append((first, clock() - t5))
            return
        steps.append((clock() - t5, t2 - t1, t3 - t2, t4 - t3, t5 - t4))


def ranges_per_step(side) -> float:
    """The record_function ranges one epoch opens (torch's DataLoader and optimizer open one
    per call each), per step: whether the API adds any of its own."""
    from torch.profiler import ProfilerActivity, profile

    saved = os.dup(2)  # the profiler's own start/stop lines on stderr are no figure of ours
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _, _, samples = epoch(*side)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    opened = sum(1 for e in prof.events() if e.is_user_annotation)
    return opened / (samples // side[0].batch_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="rounds of one epoch each")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, _ = data()
    plain_model, plain_opt = model_and_optimizer()
    plain = DataLoader(train, batch_size=args.batch, shuffle=True, drop_last=True)
    alone = ps.start()  # a plain process: a world of one, no record (C)
    recording = ps.Run(alone.cfg, alone.world, "digits", [])  # as parascale run's rank 0 (B)
    recording.recording = True
    sides = {"A": (plain, plain_model, plain_opt, lambda loss: loss.backward())}
    for name, run in (("B", recording), ("C", alone)):
        model, optimizer = model_and_optimizer()
        loader = run.shard(DataLoader(train, batch_size=args.batch, shuffle=True))
        model, optimizer = run.setup(model, optimizer)
        sides[name] = (loader, model, optimizer, run.backward)
    for side in sides.values():  # warm-up: first epochs build caches and allocator pools
        epoch(*side)
    rows: dict[str, list[tuple[float, float, int]]] = {"A": [], "B": [], "C": []}
    for r in range(args.rounds):
        for name in ("ABC", "BCA", "CAB")[r % 3]:
            rows[name].append(epoch(*sides[name]))
    wall = {k: [n / w for w, _, n in v] for k, v in rows.items()}
    cpu = {k: [n / c for _, c, n in v] for k, v in rows.items()}
    # like with like: every side's epochs step through the same samples (A's drop_last, the
    # shard's dropped incomplete global batch)
    samples = {n for v in rows.values() for _, _, n in v}
    if len(samples) != 1:
        sys.exit(f"the sides' epochs differ in samples ({sorted(samples)}): not comparable")
    steps = samples.pop() // args.batch
    print(f"script API overhead: MLP on digits, batch {args.batch}, {steps} steps per epoch, "
          f"{args.rounds} rounds ABC/BCA/CAB, 1 thread, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}")
    for label, figures in (("wall", wall), ("cpu", cpu)):
        a = statistics.median(figures["A"])
        print(f"  {label:4s} median samples/s: plain {a:,.0f}; " + "; ".join(
            f"{what} {statistics.median(figures[k]):,.0f}, ratio "
            f"{statistics.median(figures[k]) / a:.3f} (best epochs "
            f"{max(figures[k]) / max(figures['A']):.3f})"
            for k, what in (("B", "recording"), ("C", "plain process"))))
    for k, what in (("B", "recording"), ("C", "plain process")):
        per_step = [(rk[1] - ra[1]) / steps * 1e6 for ra, rk in zip(rows["A"], rows[k])]
        print(f"  CPU time the API adds per step, {what}: "
              f"{statistics.median(per_step):.1f} us (median of rounds)")
    # where it goes: the same rounds again, each call of the loop timed (wall, median)
    calls: dict[str, list] = {k: [] for k in sides}
    ends: dict[str, list] = {k: [] for k in sides}
    for r in range(args.rounds):
        for name in ("ABC", "BCA", "CAB")[r % 3]:
            phased_epoch(*sides[name], calls[name], ends[name])
    print("  where, per call (wall us, median; B and C as the difference from A):")
    for i, phase in enumerate(PHASES):
        a = statistics.median(c[i] for c in calls["A"]) * 1e6
        print(f"    {phase:14s} A {a:7.1f}" + "".join(
            f"  {k} {statistics.median(c[i] for c in calls[k]) * 1e6 - a:+6.1f}" for k in "BC"))
    for i, phase in enumerate(("epoch start", "epoch end")):
        a = statistics.median(e[i] for e in ends["A"]) * 1e6
        print(f"    {phase:14s} A {a:7.1f}" + "".join(
            f"  {k} {statistics.median(e[i] for e in ends[k]) * 1e6 - a:+6.1f}" for k in "BC"))
    ranges = {name: ranges_per_step(side) for name, side in sides.items()}
    print("  profiler ranges opened per step (torch.profiler, one epoch): " + "; ".join(
        f"{what} {ranges[k]:.2f}" for k, what in (("A", "plain"), ("B", "recording"),
                                                   ("C", "plain process"))))
    recording.finished = alone.finished = True  # nothing to record: this is the measurement


if __name__ == "__main__":
    main()
