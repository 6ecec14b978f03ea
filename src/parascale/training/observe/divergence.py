"""The divergence check: a NaN or infinite training loss stops the run at the step it appears,
with advice that fits the run's settings.

Every rank must stop at the same step, or the ranks that carry on wait in their next collective
until the timeout. Strategies whose ranks exchange every step (``Strategy.exchanges_every_step``)
therefore decide on an all-reduce of every rank's loss (each rank fills its own slot, so the
message can name the ranks where it happened). The all-reduce is issued asynchronously after
the step's last forward, and step S is decided at the end of step S + 1 (and at the end of an
epoch): by then it finished long ago, so the host does not wait for it, and the point of
decision is the same on every rank. The step named is S; step S + 1 merely ran on with NaNs.
Strategies whose ranks do not exchange every step (``none``, local SGD with a period above 1,
the asynchronous parameter server) decide on each rank's own loss: a per-step collective would
add the very synchronisation they do without and distort what they measure. The rank that stops
is named by the launcher's failure attribution (its peers only see broken connections).

On CUDA the loss reaches the host through pinned memory and an event recorded after step S
(both made once and reused, not per step), so deciding S waits for the device to finish S, not
S + 1: the host stays up to a step ahead. A rank that decides alone waits even less: it decides
S as soon as that copy is done, and waits for it only once it is ``AHEAD`` steps behind, so the
host may queue up to two steps ahead of the device, as a plain loop's host does; its decision
point may then differ by a step between ranks, which no peer waits for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist

from parascale.batch import Derived
from parascale.config import TrainConfig
from parascale.errors import KnownFailure
from parascale.runtime import World


AHEAD = 2
"""Steps a lone CUDA rank's host may run ahead of the device before it waits for a loss."""


class NonFiniteLoss(KnownFailure):
    """The training loss became NaN or infinite."""


@dataclass
class _Pending:
    step: int
    rate: float  # the step's learning rate, for the message
    values: torch.Tensor  # one slot per rank (collective) or this rank's loss alone
    work: Any = None  # the all-reduce in flight
    host: torch.Tensor | None = None  # CUDA: the pinned copy, complete once ``ready`` is
    ready: Any = None  # CUDA: an event after the copy


class DivergenceWatch:
    """Given every step's loss (``observe``) and asked after every step (``settle``)."""

    def __init__(self, world: World, collective: bool, explain):
        self.world = world
        self.collective = collective and world.size > 1
        self.explain = explain  # (step, rate) -> the settings and the advice, one line
        self.cuda = world.device.type == "cuda"
        self.pending: list[_Pending] = []
        # CUDA: pinned buffers and events whose copies were read, for the next steps
        self._spare: list[tuple[torch.Tensor, Any]] = []

    def observe(self, step: int, loss: torch.Tensor, rate: float) -> None:
        """The step's loss, known after its last forward; nothing here waits."""
        if self.collective:
            values = torch.zeros(self.world.size, dtype=torch.float64, device=loss.device)
            values[self.world.rank] = loss.detach()
            self.pending.append(_Pending(step, rate, values,
                                         dist.all_reduce(values, async_op=True)))
        elif self.cuda:  # copied as it is (no conversion on the device), read as a float
            self.pending.append(_Pending(step, rate, loss.detach().reshape(1)))
        else:  # this rank's loss alone, read on the host when decided: no work in the step
            self.pending.append(_Pending(step, rate, loss.detach()))

    def settle(self, final: bool = False) -> None:
        """After every step: decide the steps before this one (every step with ``final``, at
        the end of an epoch); raise NonFiniteLoss for the first bad one."""
        if not self.cuda and not self.collective:  # the common lone-rank case, kept short
            while len(self.pending) > (0 if final else 1):
                item = self.pending.pop(0)
                value = item.values.item()
                if not math.isfinite(value):
                    self._decide(item, [value])
            return
        if self.cuda:
            self._settle_cuda(final)
            return
        while len(self.pending) > (0 if final else 1):
            item = self.pending.pop(0)
            if item.work is not None:
                item.work.wait()
            self._decide(item, item.values.tolist())

    def _settle_cuda(self, final: bool) -> None:
        for item in self.pending:
            self._to_host(item)
        lone = not self.collective
        while len(self.pending) > (0 if final else 1):
            item = self.pending[0]
            # a lone rank decides what the device has finished, and waits only when behind
            if lone and not final and len(self.pending) <= AHEAD and not item.ready.query():
                return
            self.pending.pop(0)
            item.ready.synchronize()
            host = cast(torch.Tensor, item.host)  # its copy, started above
            self._spare.append((host, item.ready))
            self._decide(item, host.tolist())

    def _to_host(self, item: _Pending) -> None:
        """Start the copy of the step's result to pinned host memory the first time it is asked
        (complete once ``item.ready`` is); nothing here waits."""
        if item.host is not None:
            return
        if item.work is not None:
            item.work.wait()  # NCCL: the current stream waits for the all-reduce, not the host
        values = item.values
        spare = next((i for i, (host, _) in enumerate(self._spare)
                      if host.shape == values.shape and host.dtype == values.dtype), None)
        if spare is None:
            item.host, item.ready = torch.empty_like(values, device="cpu").pin_memory(), \
                torch.cuda.Event()
        else:
            item.host, item.ready = self._spare.pop(spare)
        item.host.copy_(values, non_blocking=True)
        item.ready.record()

    def _decide(self, item: _Pending, values: list[float]) -> None:
        bad = [r for r, v in enumerate(values) if not math.isfinite(v)]
        if not bad:
            return
        advice_ = self.explain(item.step, item.rate)
        if not self.collective:
            raise NonFiniteLoss(f"training loss is {values[0]} at step {item.step} on rank "
                                f"{self.world.rank} (decided by that rank alone: its strategy "
                                f"does not exchange every step); {advice_}")
        where = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {_ranks(bad)}"
        raise NonFiniteLoss(f"training loss is {values[bad[0]]} at step {item.step} on {where} "
                            f"(of {self.world.size}); {advice_}",
                            secondary=self.world.rank not in bad)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8
                                             else "")


def advice(cfg: TrainConfig, derived: Derived, steps_per_epoch: int, warmup_steps: int,
           step: int, rate: float) -> str:
    """Where the step was, the settings that make a step large, and what to change, one line.

    Any of them can make a loss diverge, so each one set is named with its value: the scaled
    rate and its rule, warm-up or none, momentum (which multiplies the step up to 1/(1-m)), and
    reduced precision; the advice leaves out what is not set (no warm-up to lengthen, no
    momentum to lower).
    """
    optim, precision, momentum = cfg.optim, cfg.strategy.precision, cfg.optim.momentum
    epoch, within = (step - 1) // steps_per_epoch + 1, (step - 1) % steps_per_epoch + 1
    settings = [f"epoch {epoch}" + (f" (its step {within})" if epoch > 1 else ""),
                f"learning rate {rate:g}"]
    tries = []
    if precision == "fp16":
        tries.append("--precision bf16 (fp16 overflows above 65504)")
    scaled = derived.effective_lr > optim.lr
    if optim.lr_scaling != "none":
        settings[-1] += (f" ({optim.lr_scaling} scaling of --lr {optim.lr:g} from batch "
                         f"{derived.base_batch} to {derived.global_batch} gives "
                         f"{derived.effective_lr:g})")
    if not warmup_steps:
        settings.append("no warm-up")
        if scaled:
            tries.append("--warmup-epochs 5 (a scaled rate needs a gradual warm-up)")
    elif step <= warmup_steps:
        settings.append(f"in warm-up (step {step} of {warmup_steps})")
        tries.append("a longer --warmup-epochs")
    else:
        settings.append(f"after {optim.warmup_epochs:g} warm-up epoch(s)")
    if scaled and optim.lr_scaling == "linear":
        tries.append("--lr-scaling sqrt")
    tries.append(f"a lower --lr (now {optim.lr:g})")
    if momentum > 0:
        settings.append(f"momentum {momentum:g} (steps up to {1 / (1 - momentum):.3g}x the "
                        "rate)" if momentum < 1 else f"momentum {momentum:g}")
        tries.append(f"a lower --momentum (now {momentum:g})")
    if precision != "fp32":
        settings.append(f"precision {precision}")
    if precision == "bf16":
        tries.append("--precision fp32")
    return f"{', '.join(settings)}; try {', '.join(tries[:-1])}, or {tries[-1]}" \
        if len(tries) > 1 else f"{', '.join(settings)}; try {tries[0]}"
