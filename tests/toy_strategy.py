"""A strategy of one's own, written as a user would write one (docs/strategies.md): its file,
and one line, ``sync.register(Toy)``, which tests/test_sync_toy.py runs.

After backward, every rank all-reduces its gradients, in ``--sync-option pieces=K`` messages
(the parameters split into K groups), and divides by the workers: synchronous SGD on the
global batch, written by hand.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from parascale import sync


@dataclass(frozen=True)
class ToySettings(sync.Settings):
    pieces: int = sync.option(1, "Toy: all-reduce the gradients in this many messages.",
                              minimum=1)


class Toy(sync.Strategy):
    name = "toy"
    traits = sync.Traits()  # it runs a user's script: the defaults say so
    Settings = ToySettings
    settings: ToySettings

    @classmethod
    def lockstep(cls, settings) -> bool:
        return True

    @classmethod
    def agrees(cls, settings) -> bool:
        return True

    @classmethod
    def equivalence(cls, settings) -> str | None:
        return sync.GRADIENT  # every rank steps on the mean gradient

    @classmethod
    def pattern(cls, settings) -> sync.Pattern:
        return sync.Pattern()  # one ring all-reduce of the gradients after backward

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        n = self.world.size
        size = sum(p.numel() * p.element_size() for p in self.params)
        self.bytes_per_step = int(2 * (n - 1) / n * size)  # a ring's, as the pattern says
        return model

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        if self.world.size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        k = min(self.settings.pieces, len(grads))
        for piece in range(k):
            part = grads[piece::k]
            flat = torch.cat([g.reshape(-1) for g in part])
            dist.all_reduce(flat)
            flat.div_(self.world.size)
            offset = 0
            for p, g in zip(self.params[piece::k], part):
                p.grad = flat[offset:offset + g.numel()].view_as(g).clone()
                offset += g.numel()
