"""Which samples each copy of a script sees: the trainer's arithmetic (training/loop/sampling.py:
one permutation per epoch, the same on every rank, each global batch cut into rank slices)
applied to the user's own DataLoader, so that N copies with batch b each step through exactly
the samples one copy with batch N x b would (the foundation test: tests/test_script_run.py).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from parascale.batch import steps_per_epoch
from parascale.training.loop.sampling import epoch_order, eval_shard


class TrainBatches:
    """A batch sampler: each pass is one epoch of this rank's share of every global batch; the
    last incomplete global batch is dropped, so every rank takes the same number of steps."""

    def __init__(self, samples: int, per_device: int, world: int, rank: int, seed: int,
                 shuffle: bool):
        self.samples, self.per_device, self.world, self.rank = samples, per_device, world, rank
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0

    def __len__(self) -> int:
        return steps_per_epoch(self.samples, self.per_device * self.world)

    def __iter__(self) -> Iterator[list[int]]:
        self.epoch += 1  # every rank passes as often as the others: the same permutation
        # train_shard's slices, cut from one list (not a tensor per step: .tolist() each
        # step was a visible share of a small model's step)
        order = epoch_order(self.samples, self.seed, self.epoch).tolist() if self.shuffle \
            else range(self.samples)
        width = self.per_device * self.world
        for number in range(len(self)):
            first = number * width + self.rank * self.per_device
            yield list(order[first:first + self.per_device])


class EvalBatches:
    """This rank's contiguous, unpadded share of an evaluation set (every sample counted once
    over the ranks)."""

    def __init__(self, samples: int, world: int, rank: int, batch: int):
        self.batches = [b.tolist() for b in eval_shard(samples, world, rank, batch)]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)


def loader_like(given: Any, sampler: Any) -> DataLoader:
    """A DataLoader over ``given``'s dataset (or ``given`` itself, a dataset) with ``sampler``
    as its batch sampler and ``given``'s collation, workers and pinning."""
    if not isinstance(given, DataLoader):
        return DataLoader(given, batch_sampler=sampler)
    return DataLoader(given.dataset, batch_sampler=sampler, collate_fn=given.collate_fn,
                      num_workers=given.num_workers, pin_memory=given.pin_memory,
                      worker_init_fn=given.worker_init_fn,
                      persistent_workers=given.persistent_workers)


def batch_size_of(given: Any, batch_size: int | None) -> int:
    """The per-device batch: the one given, else the DataLoader's own."""
    size = batch_size if batch_size is not None else getattr(given, "batch_size", None)
    if not isinstance(size, int) or size < 1:
        raise ValueError("shard() needs the batch size per device: a DataLoader with "
                         "batch_size=B, or shard(dataset, batch_size=B)")
    return size


def shuffles(given: Any, shuffle: bool | None) -> bool:
    """Whether the DataLoader drew its samples at random (shuffle=True), unless told."""
    if shuffle is not None:
        return shuffle
    sampler = getattr(given, "sampler", None)
    return isinstance(sampler, torch.utils.data.RandomSampler)
