"""The GPT on Shakespeare, small enough for benchmarks/advise.py on a 2-core machine: the
character model of ``--model gpt --dataset shakespeare`` (parascale's own GPT and corpus) on
a slice of the corpus, so that an epoch is a few hundred steps and its evaluation (the
validation loss the target is on) comes every few seconds. The whole corpus is 8.6 million
training characters: one epoch of it would take an hour here, and parascale evaluates at the
end of an epoch.

    parascale train --task advise_tasks:shakespeare_gpt ...   (with benchmarks/ on the path)
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from parascale.data.text import TRAIN_FRACTION, corpus, encode
from parascale.models import gpt
from parascale.tasks import Task

CONTEXT = 32
TRAIN_CHARACTERS = 160_000
EVAL_CHARACTERS = 32_000


class Windows(Dataset):
    """Windows of CONTEXT characters and the next CONTEXT, starting every CONTEXT."""

    def __init__(self, stream: torch.Tensor):
        self.stream = stream

    def __len__(self) -> int:
        return (len(self.stream) - 1) // CONTEXT

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.stream[i * CONTEXT:i * CONTEXT + CONTEXT + 1].long()
        return window[:-1], window[1:]


def loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def shakespeare_gpt() -> Task:
    ids, vocab = encode(corpus())
    cut = int(len(ids) * TRAIN_FRACTION)  # the held-out tenth starts here, as in training
    train, held = ids[:TRAIN_CHARACTERS], ids[cut:cut + EVAL_CHARACTERS]

    def model() -> nn.Module:
        return gpt.build(len(vocab), (CONTEXT,), gpt_layers=2, gpt_heads=2, gpt_width=64)

    return Task(train_data=Windows(train), eval_data=Windows(held), model=model, loss=loss,
                name="gpt on a Shakespeare slice", unit="tokens",
                units_per_sample=float(CONTEXT))
