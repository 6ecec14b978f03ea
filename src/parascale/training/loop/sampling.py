"""Which samples each rank sees: the arithmetic that makes N workers equal one big batch.

Training: every epoch, one permutation of the training set, the same on every rank (seeded by
seed and epoch). Global step s takes the next ``global_batch`` samples of it; micro-batch m of
that step is the m-th slice of ``world * per_device`` samples, and rank r takes the r-th slice
of ``per_device`` inside it. So the union of what all ranks see in one step is exactly the batch
one worker with batch ``global_batch`` would see, which is what makes synchronous data
parallelism reproduce single-device training. The last incomplete global batch is dropped, so
every rank runs the same number of steps (uneven counts hang collectives).

Evaluation: contiguous, unpadded shards (rank r gets [r*n/N, (r+1)*n/N)), so that summing
counts over ranks counts every test sample exactly once (a padding sampler would count some
twice and skew accuracy). With a budget (``--eval-batches``) the n are a sample of the split,
drawn once from the seed alone and sorted: the same samples on any number of ranks and at
every evaluation, sharded as the whole split is.
"""
from __future__ import annotations

import torch

from parascale.batch import steps_per_epoch


def epoch_order(n_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's permutation, identical on every rank; epochs differ (reshuffled)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_samples, generator=generator)


def train_shard(n_samples: int, per_device: int, world: int, rank: int, accumulate: int,
                seed: int, epoch: int, steps: int | None = None) -> list[list[torch.Tensor]]:
    """For each step of the epoch, this rank's micro-batches (index tensors)."""
    order = epoch_order(n_samples, seed, epoch)
    micro = per_device * world
    global_batch = micro * accumulate
    count = steps_per_epoch(n_samples, global_batch) if steps is None else steps
    plan = []
    for step in range(count):
        block = order[step * global_batch:(step + 1) * global_batch]
        plan.append([block[m * micro + rank * per_device:m * micro + (rank + 1) * per_device]
                     for m in range(accumulate)])
    return plan


#: told apart from the epochs' permutations, which add the epoch (1, 2...) to the same product
EVAL_STREAM = 999_983


def eval_sample(n_samples: int, count: int, seed: int) -> torch.Tensor:
    """``count`` of a split's ``n_samples`` indices drawn by ``seed`` without replacement, in
    ascending order; all of them when ``count`` is not below ``n_samples``."""
    if count >= n_samples:
        return torch.arange(n_samples)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + EVAL_STREAM)
    return torch.randperm(n_samples, generator=generator)[:count].sort().values


def eval_shard(samples: int | torch.Tensor, world: int, rank: int,
               batch: int) -> list[torch.Tensor]:
    """This rank's contiguous share of the evaluated samples (the first ``samples`` indices of
    the split, or the given ones), in batches; may be empty."""
    indices = torch.arange(samples) if isinstance(samples, int) else samples
    n_samples = len(indices)
    start, stop = rank * n_samples // world, (rank + 1) * n_samples // world
    return list(indices[start:stop].split(batch)) if stop > start else []
