"""``--learners auto``: Crossbow's auto-tuner, which adds learners while throughput grows.

Crossbow samples throughput at tuning points; at each one ``gain = (now - before) / before``, and
if the gain exceeds a threshold (10%) one learner per device is added, otherwise the last one
added is removed and tuning stops (hill climbing). Crossbow tunes while it trains. Here the tuner
runs before the first epoch, on real steps of the run's model, data and strategy (each trial
count for about a second), and training then starts from the initial model with the chosen
count: the per-device batch stays fixed for the whole run, so epochs, the plan and the step
times mean what they mean for every other strategy. The tuner's time counts in the run's
training time and time-to-accuracy, and its decisions are kept in the record.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parascale.batch import DEFAULT_BATCH
from parascale.config import TrainConfig
from parascale.runtime.world import World
from parascale.sync.base import Strategy

MAX_LEARNERS = 16
INTERVAL_S = 1.0  # time per tuning point (Crossbow samples throughput every second)
WARM_STEPS = 3  # steps before each tuning point's clock starts (allocations, first calls)


@dataclass
class HillClimb:
    """The decision rule alone: feed it the throughput at the current count, it says the next."""

    threshold: float
    limit: int = MAX_LEARNERS
    learners: int = 1
    previous: float | None = None
    done: bool = False
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def observe(self, throughput: float, elapsed_s: float | None = None) -> None:
        m = self.learners
        gain = None if self.previous is None else (throughput - self.previous) / self.previous
        if gain is not None and gain <= self.threshold:
            decision, self.learners, self.done = "remove", m - 1, True
        elif m >= self.limit:
            decision, self.done = "stop", True
        else:
            decision, self.learners, self.previous = "add", m + 1, throughput
        self.decisions.append({"learners": m, "throughput": throughput, "gain": gain,
                               "decision": decision, "elapsed_s": elapsed_s})


def limit(cfg: TrainConfig, world_size: int, n_train: int) -> int:
    """At most MAX_LEARNERS, and few enough that one step's batches fit in the training set."""
    batch = cfg.batch.batch_size or DEFAULT_BATCH
    return max(1, min(MAX_LEARNERS, n_train // (batch * world_size)))


def tune(cfg: TrainConfig, world: World, bundle, build_model: Callable[[], nn.Module],
         kind: type[Strategy]) -> tuple[int, list[dict[str, Any]], float]:
    """The count of learners to train with, the decisions, and the seconds tuning took. Every
    rank measures and all agree: throughput is the world's (samples over the slowest rank)."""
    started = time.perf_counter()
    climb = HillClimb(kind.settings_of(cfg).tune_threshold,
                      limit(cfg, world.size, len(bundle.train)))
    while not climb.done:
        throughput = measure(cfg, world, bundle, build_model, climb.learners, kind)
        climb.observe(throughput, time.perf_counter() - started)
        if world.is_main:
            last = climb.decisions[-1]
            gain = "" if last["gain"] is None else f", {last['gain']:+.0%}"
            print(f"parascale: tuning: {last['learners']} learner(s) per device: "
                  f"{throughput:,.0f} samples/s{gain} -> {last['decision']}", flush=True)
    return climb.learners, climb.decisions, time.perf_counter() - started


def measure(cfg: TrainConfig, world: World, bundle, build_model: Callable[[], nn.Module],
            learners: int, kind: type[Strategy]) -> float:
    """Samples per second of the whole world training with ``learners`` per device under
    ``kind`` (SMA, which passes itself: this module does not import it back)."""
    strategy = kind(cfg.replace(sync_options={**cfg.strategy.sync_options,
                                              "learners": learners}), world)
    net = strategy.wrap(build_model())
    optimizer = torch.optim.SGD(net.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum,
                                weight_decay=cfg.optim.weight_decay)
    batch = (cfg.batch.batch_size or DEFAULT_BATCH) * learners
    generator = torch.Generator().manual_seed(cfg.job.seed * 7919 + world.rank)
    loss_fn = nn.CrossEntropyLoss()
    step = 0

    def run(steps: int) -> float:
        nonlocal step
        began = time.perf_counter()
        for _ in range(steps):
            rows = torch.randint(len(bundle.train), (batch,), generator=generator)
            x, y = next(iter(bundle.train.batches([rows], world.device, train=True,
                                                  generator=generator)))
            loss_fn(net(x), y).backward()
            strategy.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
            step += 1
            strategy.after_step(step)
        if world.device.type == "cuda":
            torch.cuda.synchronize(world.device)
        return time.perf_counter() - began

    warm = run(WARM_STEPS) / WARM_STEPS
    steps = torch.tensor([min(500, max(5, math.ceil(INTERVAL_S / max(warm, 1e-6))))],
                         device=world.device)
    if world.size > 1:  # every rank must take the same steps (the synchronisations collect)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    seconds = torch.tensor([run(int(steps))], dtype=torch.float64, device=world.device)
    if world.size > 1:
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return int(steps) * batch * world.size / float(seconds)
