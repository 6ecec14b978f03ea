"""Local SGD: every worker steps on its own gradients; parameters are averaged every H steps.

This is post-local SGD's averaging (Lin et al., "Don't use large mini-batches, use local SGD",
ICLR 2020): parameters (and model buffers) are averaged, each worker keeps its own momentum
buffer. With H = 1 this equals synchronous SGD on the averaged gradient even with momentum and
weight decay: all workers start the step from the same parameters, and the momentum buffer and
the update are linear in the gradient, so the mean of the N updated replicas is the update
computed from the mean gradient (up to rounding). With H > 1 the momentum buffers differ and the
algorithm is genuinely different; its reference is a hand computation
(tests/test_sync_local_sgd.py).

Evaluation and the saved model use the *average* of the replicas (a copy, so that evaluating
does not change the training trajectory); when the last step was an averaging step the replicas
already agree and the model itself is used.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from parascale import lazy
from parascale.sync.base import Strategy
from parascale.sync.flat import Flat
from parascale.sync.options import Settings, option
from parascale.sync.traits import UPDATE, Pattern

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch import nn
else:  # the registry is read without torch: imported on first use
    dist = lazy.module("torch.distributed", globals(), "dist")


@dataclass(frozen=True)
class LocalSGDSettings(Settings):
    period: int = option(1, "Local SGD: average the parameters every this many local steps.",
                         minimum=1, flag=True)


class LocalSGD(Strategy):
    name = "local-sgd"
    Settings = LocalSGDSettings
    settings: LocalSGDSettings

    @classmethod
    def lockstep(cls, settings: LocalSGDSettings) -> bool:
        return settings.period == 1

    @classmethod
    def equivalence(cls, settings: LocalSGDSettings) -> str | None:
        # averaging after every step (module docstring); every H > 1 steps, the replicas'
        # momentum buffers differ and the algorithm is another one
        return UPDATE if settings.period == 1 else None

    @classmethod
    def pattern(cls, settings: LocalSGDSettings) -> Pattern:
        # one ring allreduce of the parameters every period steps, after backward
        return Pattern(every=settings.period)

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = model
        self.flat = Flat(model)
        self.buffer = self.flat.new()
        self.period = self.settings.period
        self.steps_since_average = 0
        self.averages = 0
        self._copy: nn.Module | None = None  # holds the average for evaluation, made once
        self._show_copy = False
        n = self.world.size
        # one ring allreduce of the parameters every `period` steps, spread over those steps
        self.bytes_per_average = int(2 * (n - 1) / n * self.flat.bytes)
        self.bytes_per_step = self.bytes_per_average // self.period
        return model

    def after_step(self, step: int) -> None:
        self.steps_since_average += 1
        self._show_copy = False
        if self.steps_since_average == self.period:
            self._average_into(self.model)
            self.steps_since_average = 0
            self.averages += 1

    def _average_into(self, target: nn.Module) -> None:
        """Set ``target``'s parameters and buffers to the mean of this model's over all ranks."""
        n = self.world.size
        if n == 1:
            if target is not self.model:
                target.load_state_dict(self.model.state_dict())
            return
        vector = self.flat.gather_params(self.buffer)
        dist.all_reduce(vector)
        vector.div_(n)
        (self.flat if target is self.model else Flat(target)).scatter_params(vector)
        for mine, theirs in zip(self.model.buffers(), target.buffers()):
            value = mine.detach().clone()
            if value.is_floating_point():  # running statistics: averaged
                dist.all_reduce(value)
                value.div_(n)
            else:  # counters (num_batches_tracked): rank 0's
                dist.broadcast(value, src=0)
            theirs.copy_(value)

    def before_evaluation(self) -> None:
        # after an averaging step the replicas agree (buffers too: they were averaged)
        self._show_copy = self.steps_since_average > 0
        if self._show_copy:
            if self._copy is None:
                self._copy = copy.deepcopy(super().local_module())
            self._average_into(self._copy)

    def local_module(self) -> nn.Module:
        """The replica, or after ``before_evaluation`` the average of all replicas."""
        if self._show_copy and self._copy is not None:
            return self._copy
        return super().local_module()

    def state_dict(self) -> dict:
        # each rank's replica and momentum are its own: the checkpoint keeps every rank's
        return {"steps_since_average": self.steps_since_average, "averages": self.averages}

    def load_state_dict(self, state: dict) -> None:
        self.steps_since_average = int(state["steps_since_average"])
        self.averages = int(state["averages"])

    def options(self) -> dict:
        return {**super().options(), "bytes_per_average": self.bytes_per_average}

    def measurements(self) -> dict:
        return {"averages": self.averages}
