"""Which engine should run SMA's learners on a CPU? Replicas one after another ("loop") against
stacked parameters under torch.func.vmap ("vmap"), the choice in ``parascale.sync.learners``.

For each model and learner count M, training steps per second (forward, backward, SGD step on
M batches of --batch rows) of both engines, timed side by side in alternating rounds; the table
shows the median over rounds, the vmap/loop ratio, and samples per second (M x batch x steps/s),
whose growth with M is what Crossbow's auto-tuner looks for.

    .venv/bin/python benchmarks/learners.py [--rounds 3] [--seconds 0.5] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch
from torch import nn

from parascale import models
from parascale.sync.learners import ENGINES, make_learners

SHAPE = (1, 16, 16)


def steps_per_second(net: nn.Module, m: int, batch: int, seconds: float) -> float:
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(m * batch, *SHAPE), torch.randint(0, 10, (m * batch,))

    def step() -> None:
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        step()
        count += 1
    return count / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--models", default="mlp,lenet,resnet20")
    parser.add_argument("--learners", default="1,2,4")
    args = parser.parse_args()
    print(f"# {platform.node()}, torch {torch.__version__}; per-learner batch {args.batch}, "
          f"inputs {SHAPE}, {args.rounds} alternating rounds of {args.seconds} s per engine")
    print("| threads | model | M | loop steps/s | vmap steps/s | vmap / loop | "
          "loop samples/s | vmap samples/s |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        for name in args.models.split(","):
            torch.manual_seed(0)
            model = models.build(name, 10, SHAPE)
            for m in map(int, args.learners.split(",")):
                nets = {e: make_learners(model, m, e) for e in ENGINES}
                rates: dict[str, list[float]] = {e: [] for e in ENGINES}
                for k in range(args.rounds):
                    order = ENGINES if k % 2 == 0 else ENGINES[::-1]
                    for engine in order:
                        rates[engine].append(steps_per_second(nets[engine], m, args.batch,
                                                              args.seconds))
                loop, vmap = (statistics.median(rates[e]) for e in ENGINES)
                ratios = [v / lo for lo, v in zip(rates["loop"], rates["vmap"])]
                print(f"| {threads} | {name} | {m} | {loop:,.1f} | {vmap:,.1f} | "
                      f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
                      f"{loop * m * args.batch:,.0f} | {vmap * m * args.batch:,.0f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
