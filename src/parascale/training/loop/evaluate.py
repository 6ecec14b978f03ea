"""Evaluation on every rank, each over its own unpadded share, combined by summing counts.

Every metric of the task (its loss first) is a mean over a batch's samples; a batch's mean is
weighted by its sample count, and the sums and counts of all ranks are added up, so each figure
is the mean over the evaluated samples with every one counted exactly once.

What is evaluated (:func:`coverage`): the whole split, or with a budget (``--eval-batches``) a
fixed sample of it drawn by the seed, the same at every evaluation and on any number of ranks.
By default a split is evaluated whole up to ``WHOLE_UP_TO`` units (samples, or a token model's
tokens: every image test set parascale ships, and ImageNet's 50,000 validation images), and a
larger one on ``DEFAULT_BATCHES`` global batches of it (nanoGPT's ``eval_iters``): a bounded
cost, about the compute of 70 training steps, where the shakespeare corpus's held-out tenth
(956,160 tokens) took longer than a 2,000-step run's steps did to evaluate whole on a busy CPU.
Rank 0 says what it evaluates in a line first when that is expected to take more than
``ANNOUNCE_S``, and shows a bar on a terminal (never in the log) while it runs.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from parascale.runtime import World
from parascale.tasks import Task, samples_in
from parascale.training.loop.sampling import eval_sample, eval_shard
from parascale.training.observe import console

if TYPE_CHECKING:
    from parascale.config import TrainConfig
    from parascale.runrecord import EpochEntry
    from parascale.training.loop.run import Run

WHOLE_UP_TO = 100_000
"""Units of a split (samples, or tokens for a token model) the default evaluation takes whole."""
DEFAULT_BATCHES = 200
"""Global batches of the default evaluation of a larger split."""
ANNOUNCE_S = 3.0
"""Seconds beyond which an evaluation is announced by a line before it begins."""
SPLIT_NAMES = {"test": "test", "val": "validation"}


@dataclass(frozen=True)
class Coverage:
    """What one split's evaluation covers: the sample ``indices`` of its ``of`` samples, drawn
    by ``seed``, or all of them (``seed`` None)."""

    indices: torch.Tensor
    of: int
    seed: int | None

    def section(self) -> dict[str, Any]:
        """The epoch entry's ``evaluation`` figures of the split (docs/record.md)."""
        return {"samples": len(self.indices), "of": self.of, "seed": self.seed}


def coverage(cfg: TrainConfig, n_samples: int, global_batch: int,
             units_per_sample: float) -> Coverage:
    """What an evaluation of a split of ``n_samples`` covers under ``--eval-batches``."""
    budget = cfg.evaluation.eval_batches
    if budget is None:  # the default: whole when small
        budget = 0 if n_samples * units_per_sample <= WHOLE_UP_TO else DEFAULT_BATCHES
    if not budget or budget * global_batch >= n_samples:
        return Coverage(torch.arange(n_samples), n_samples, None)
    return Coverage(eval_sample(n_samples, budget * global_batch, cfg.job.seed), n_samples,
                    cfg.job.seed)


def expected_s(samples: int, step_samples: int, compute_s: float | None) -> float | None:
    """About how long a rank takes to evaluate ``samples`` at its training's pace: a forward
    pass is about a third of a step's compute (forward and backward, ``compute_s`` over
    ``step_samples``); an overestimate, as evaluation needs no graph. None: no step timed."""
    if not compute_s:
        return None
    return samples * compute_s / step_samples / 3


def announcement(name: str, cover: Coverage, expected: float | None) -> str | None:
    """The line said before evaluating split ``name`` when it is expected to take longer than
    ``ANNOUNCE_S`` (or nothing says how long), else None."""
    if expected is not None and expected <= ANNOUNCE_S:
        return None
    shown = SPLIT_NAMES.get(name, name)
    what = f"the {cover.of:,} {shown} samples" if cover.seed is None else \
        (f"{len(cover.indices):,} of the {cover.of:,} {shown} samples (drawn by --seed "
         f"{cover.seed}, the same at every evaluation; --eval-batches 0 evaluates all)")
    return f"parascale: evaluating {what}..."


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
            autocast: Callable, extra: int = 0,
            label: str | None = None) -> torch.Tensor:
    """Each metric's sum over the given index batches of ``split``, then the sample count;
    ``extra`` more passes over the split's first sample whose figures are dropped; with a
    ``label``, a bar on the terminal (if there is one) while it runs."""
    metrics = task.all_metrics()
    was_training = model.training
    model.eval()
    totals = torch.zeros(len(metrics) + 1, dtype=torch.float64, device=device)
    bar = tqdm(total=len(batches), unit="batch", file=console.terminal(sys.stderr),
               mininterval=0.5, disable=None if label else True, leave=False,
               desc=f"evaluating {label}")
    # on a GPU the host queues batches far ahead of the device: the bar waits for the batch
    # before the one just queued, so that it shows work done, not work queued
    paced = device.type == "cuda" and not bar.disable
    done: Any = None  # the CUDA event after the batch before
    for batch in split.batches(batches, device, train=False):
        once, n = _Once(model), samples_in(batch)
        with autocast():
            values = [m.fn(once, batch) for m in metrics]
        for i, value in enumerate(values):
            totals[i] += torch.as_tensor(value, device=device).detach().double().reshape(()) * n
        totals[-1] += n
        if paced:
            if done is not None:
                done.synchronize()
            done = torch.cuda.Event()
            done.record()
        bar.update()
    bar.close()
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
             autocast: Callable, samples: torch.Tensor | None = None,
             label: str | None = None, lockstep: bool = False) -> dict[str, float]:
    """Each metric (the loss first) over the split's ``samples`` (default: all of them), every
    one counted exactly once; ``label``: rank 0's bar on a terminal.

    Runs on the plain module, not the DDP wrapper: evaluation needs no gradient hooks, and ranks
    may have different numbers of batches here (shards differ by one sample). ``lockstep``:
    forward communicates (FSDP gathers each unit's parameters in it), so a rank with fewer
    batches makes as many forward passes as the rank with the most, on a sample of its own
    whose figures are dropped.
    """
    evaluated = len(split) if samples is None else samples
    mine = eval_shard(evaluated, world.size, world.rank, batch)
    most = max(len(eval_shard(evaluated, world.size, r, batch)) for r in range(world.size)) \
        if lockstep else len(mine)
    totals = _totals(task, model, split, mine, world.device, autocast, most - len(mine), label)
    dist.all_reduce(totals)
    return _means(task, totals)


def evaluate_epoch(run: Run, entry: EpochEntry, autocast: Callable) -> None:
    """The evaluation due after an epoch: each split's metrics into ``entry.metrics`` (a key
    is ``<split>_<metric>``: test_accuracy, val_loss) and what each covered into
    ``entry.evaluation``; rank 0 announces a long one and shows its bar on a terminal."""
    cfg, world, task = run.cfg, run.world, run.task
    per_device = run.plan.derived.per_device_batch
    run.strategy.before_evaluation()
    compute = (entry.step_split_s or {}).get("compute")
    # --val-fraction: the validation split, what a search may look at
    for name, split in (("test", run.bundle.test if cfg.evaluation.evaluate_test else None),
                        ("val", run.bundle.val)):
        if split is None:
            continue
        cover = coverage(cfg, len(split), run.plan.derived.global_batch, task.units_per_sample)
        if world.is_main:
            share = -(-len(cover.indices) // world.size)  # each rank's, at most
            line = announcement(name, cover, expected_s(share, per_device * cfg.batch.accumulate,
                                                         compute))
            if line:
                print(line, flush=True)
        figures = evaluate(task, run.strategy.local_module(), split, world, max(per_device, 256),
                           autocast, cover.indices, SPLIT_NAMES[name] if world.is_main else None,
                           run.strategy.evaluates_in_lockstep)
        entry.metrics.update({f"{name}_{metric}": value for metric, value in figures.items()})
        entry.evaluation[name] = cover.section()


def evaluate_alone(task: Task, model: nn.Module, split, device: torch.device | str = "cpu",
                   batch: int = 256) -> dict[str, float]:
    """Each metric over ``split`` in this process, outside any world (a search's one
    evaluation of its best trial on the test set)."""
    totals = _totals(task, model, split, eval_shard(len(split), 1, 0, batch),
                     torch.device(device), contextlib.nullcontext)
    return _means(task, totals)
