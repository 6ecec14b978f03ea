"""Parameters or gradients of a model as one contiguous vector: one message instead of one per
tensor, for the strategies that communicate by hand (reduce-broadcast, parameter server, local SGD).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from parascale import lazy

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # the strategies' registry imports this module without torch
    torch = lazy.module("torch", globals())


class Flat:
    """The trainable parameters of ``model`` in a fixed order, copied to and from one vector."""

    def __init__(self, model: nn.Module, device: torch.device | None = None):
        self.params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"parameters of one floating-point type expected, got "
                             f"{sorted(map(str, dtypes))}; keep the model in one dtype")
        self.dtype = dtypes.pop()
        self.numel = sum(p.numel() for p in self.params)
        self.device = device or self.params[0].device
        self.element_size = self.params[0].element_size()
        self.bytes = self.numel * self.element_size

    def new(self) -> torch.Tensor:
        return torch.empty(self.numel, dtype=self.dtype, device=self.device)

    def gather_grads(self, out: torch.Tensor) -> torch.Tensor:
        """Copy every gradient into ``out`` (zeros where a parameter got none)."""
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                out[offset:offset + n].zero_()
            else:
                out[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        return out

    def scatter_grads(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            piece = flat[offset:offset + n].view_as(p)
            if p.grad is None:
                p.grad = piece.to(p.device, copy=True)
            else:
                p.grad.copy_(piece)
            offset += n

    def gather_params(self, out: torch.Tensor) -> torch.Tensor:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                out[offset:offset + n].copy_(p.reshape(-1))
                offset += n
        return out

    def scatter_params(self, flat: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset:offset + n].view_as(p))
                offset += n


def shard_bounds(numel: int, shards: int) -> list[tuple[int, int]]:
    """[start, stop) of each of ``shards`` contiguous pieces, sizes differing by at most one."""
    return [(k * numel // shards, (k + 1) * numel // shards) for k in range(shards)]
