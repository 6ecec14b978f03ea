"""Evaluation on every rank, each over its own unpadded share, combined by summing counts."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parascale.runtime import World
from parascale.training.sampling import eval_shard


@torch.no_grad()
def evaluate(model: nn.Module, split, world: World, batch: int,
             autocast: Callable) -> tuple[float, float]:
    """(test loss, accuracy) over the whole test set, every sample counted exactly once.

    Runs on the plain module, not the DDP wrapper: evaluation needs no gradient hooks, and ranks
    may have different numbers of batches here (shards differ by one sample).
    """
    was_training = model.training
    model.eval()
    device = world.device
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for x, y in split.batches(eval_shard(len(split), world.size, world.rank, batch), device,
                              train=False):
        with autocast():
            logits = model(x)
        totals[0] += F.cross_entropy(logits.float(), y, reduction="sum").double()
        totals[1] += (logits.argmax(dim=1) == y).sum()
        totals[2] += y.shape[0]
    dist.all_reduce(totals)
    model.train(was_training)
    count = float(totals[2])
    return float(totals[0]) / count, float(totals[1]) / count
