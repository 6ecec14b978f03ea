"""Evaluation on every rank, each over its own unpadded share, combined by summing counts.

Every metric of the task (its loss first) is a mean over a batch's samples; a batch's mean is
weighted by its sample count, and the sums and counts of all ranks are added up, so each figure
is the mean over the whole split with every sample counted exactly once.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parascale.runtime import World
from parascale.tasks import Task, samples_in
from parascale.training.loop.sampling import eval_shard


class _Once:
    """The model, run once per input within one batch: the loss and each metric call it on
    the same tensors (the built-in task's loss and accuracy both need ``model(x)``), and the
    forward pass is the cost of an evaluation. The inputs are kept, so their ids stay theirs."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.inputs: tuple | None = None
        self.output: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = (args, kwargs)
        if self.inputs is None or not _same(self.inputs, inputs):
            self.inputs, self.output = inputs, self.model(*args, **kwargs)
        return self.output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def _same(a: tuple, b: tuple) -> bool:
    (args_a, kwargs_a), (args_b, kwargs_b) = a, b
    return len(args_a) == len(args_b) and all(x is y for x, y in zip(args_a, args_b)) and \
        kwargs_a.keys() == kwargs_b.keys() and all(kwargs_a[k] is kwargs_b[k] for k in kwargs_a)


@torch.no_grad()
def _totals(task: Task, model: nn.Module, split, batches: Sequence, device: torch.device,
            autocast: Callable, extra: int = 0) -> torch.Tensor:
    """Each metric's sum over the given index batches of ``split``, then the sample count;
    ``extra`` more passes over the split's first sample whose figures are dropped."""
    metrics = task.all_metrics()
    was_training = model.training
    model.eval()
    totals = torch.zeros(len(metrics) + 1, dtype=torch.float64, device=device)
    for batch in split.batches(batches, device, train=False):
        once, n = _Once(model), samples_in(batch)
        with autocast():
            values = [m.fn(once, batch) for m in metrics]
        for i, value in enumerate(values):
            totals[i] += torch.as_tensor(value, device=device).detach().double().reshape(()) * n
        totals[-1] += n
    for batch in split.batches([torch.arange(1)] * extra, device, train=False):
        once = _Once(model)
        with autocast():  # the forward passes a counted batch makes, its figures dropped
            for m in metrics:
                m.fn(once, batch)
    model.train(was_training)
    return totals


def _means(task: Task, totals: torch.Tensor) -> dict[str, float]:
    count = float(totals[-1])
    return {m.name: float(totals[i]) / count for i, m in enumerate(task.all_metrics())}


def evaluate(task: Task, model: nn.Module, split, world: World, batch: int,
             autocast: Callable, lockstep: bool = False) -> dict[str, float]:
    """Each metric (the loss first) over the whole split, every sample counted exactly once.

    Runs on the plain module, not the DDP wrapper: evaluation needs no gradient hooks, and ranks
    may have different numbers of batches here (shards differ by one sample). ``lockstep``:
    forward communicates (FSDP gathers each unit's parameters in it), so a rank with fewer
    batches makes as many forward passes as the rank with the most, on a sample of its own
    whose figures are dropped.
    """
    mine = eval_shard(len(split), world.size, world.rank, batch)
    most = max(len(eval_shard(len(split), world.size, r, batch)) for r in range(world.size)) \
        if lockstep else len(mine)
    totals = _totals(task, model, split, mine, world.device, autocast, most - len(mine))
    dist.all_reduce(totals)
    return _means(task, totals)


def evaluate_alone(task: Task, model: nn.Module, split, device: torch.device | str = "cpu",
                   batch: int = 256) -> dict[str, float]:
    """Each metric over ``split`` in this process, outside any world (a search's one
    evaluation of its best trial on the test set)."""
    totals = _totals(task, model, split, eval_shard(len(split), 1, 0, batch),
                     torch.device(device), contextlib.nullcontext)
    return _means(task, totals)
