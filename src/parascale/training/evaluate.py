"""Evaluation on every rank, each over its own unpadded share, combined by summing counts."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parascale.runtime import World
from parascale.training.sampling import eval_shard


@torch.no_grad()
def _totals(model: nn.Module, split, batches: Sequence, device: torch.device,
            autocast: Callable) -> torch.Tensor:
    """(loss sum, correct, count) over the given index batches of ``split``."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for x, y in split.batches(batches, device, train=False):
        with autocast():
            logits = model(x)
        totals[0] += F.cross_entropy(logits.float(), y, reduction="sum").double()
        totals[1] += (logits.argmax(dim=1) == y).sum()
        totals[2] += y.shape[0]
    model.train(was_training)
    return totals


def evaluate(model: nn.Module, split, world: World, batch: int,
             autocast: Callable) -> tuple[float, float]:
    """(test loss, accuracy) over the whole test set, every sample counted exactly once.

    Runs on the plain module, not the DDP wrapper: evaluation needs no gradient hooks, and ranks
    may have different numbers of batches here (shards differ by one sample).
    """
    totals = _totals(model, split, eval_shard(len(split), world.size, world.rank, batch),
                     world.device, autocast)
    dist.all_reduce(totals)
    count = float(totals[2])
    return float(totals[0]) / count, float(totals[1]) / count


def evaluate_alone(model: nn.Module, split, device: torch.device | str = "cpu",
                   batch: int = 256) -> tuple[float, float]:
    """(loss, accuracy) over ``split`` in this process, outside any world (a search's one
    evaluation of its best trial on the test set)."""
    totals = _totals(model, split, eval_shard(len(split), 1, 0, batch), torch.device(device),
                     contextlib.nullcontext)
    count = float(totals[2])
    return float(totals[0]) / count, float(totals[1]) / count
