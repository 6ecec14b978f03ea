"""A user's map-style ``Dataset`` behind the trainer's :class:`~parascale.data.split.Split`
interface, so that it is sharded, shuffled, held out and resumed exactly as built-in data is:
the trainer decides which indices go in which batch, the split only fetches and collates them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from parascale.data.split import IndexBatches, Split, as_index
from parascale.tasks.base import to_device


class DatasetSplit(Split):
    """Items ``dataset[i]`` of the given index batches, collated, on the device. Without loader
    workers they are fetched in this process (no DataLoader start-up per epoch); with
    ``--loader-workers`` a DataLoader fetches them with the same index batches."""

    def __init__(self, dataset: Any, collate: Callable[[list], Any] | None = None):
        self.dataset = dataset
        self.collate = collate or default_collate

    def __len__(self) -> int:
        return len(self.dataset)

    def batches(self, index_batches: IndexBatches, device: torch.device, *, train: bool,
                generator: torch.Generator | None = None, loader_workers: int = 0,
                ) -> Iterator[Any]:
        device = torch.device(device)
        sampler = [as_index(b).tolist() for b in index_batches]
        if loader_workers:
            loader = DataLoader(self.dataset, batch_sampler=sampler, num_workers=loader_workers,
                                collate_fn=self.collate, pin_memory=device.type == "cuda")
            for batch in loader:
                yield to_device(batch, device)
            return
        for indices in sampler:
            yield to_device(self.collate([self.dataset[i] for i in indices]), device)
