"""What rank 0 says of the run as it trains: the banner before the first step (its world,
batch, learning rate and steps) and each epoch's line, in the task's unit with its metrics."""
from __future__ import annotations

from typing import cast

import torch

from parascale import tasks
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.data import DataBundle
from parascale.runrecord import EpochEntry
from parascale.runtime import World
from parascale.training.loop.evaluate import coverage


def _figure(name: str, value: float) -> str:
    return f"{name} {value:.2%}" if name == "accuracy" else f"{name} {value:.4f}"


def _perplexity(per_unit: dict[str, float], split: str) -> str:
    """A token model's perplexity beside its loss: a figure of the entry in its unit
    (runrecord.Unit), not a metric of the task, so the evaluation does not compute it twice."""
    value = per_unit.get(f"{split}_perplexity")
    return "" if value is None else f", perplexity {value:.2f}"


def _evaluated(seen: dict[str, float | None], split: str,
               metrics: list[str]) -> list[tuple[str, float]]:
    """The task's metrics with a figure on ``split`` in this epoch, in the task's order."""
    return [(m, value) for m in metrics if (value := seen.get(f"{split}_{m}")) is not None]


def epoch_line(entry: EpochEntry, plan: Plan, task: tasks.Task) -> str:
    metrics = [m.name for m in task.metrics]
    seen = entry.metrics
    per_unit = entry.unit.entry_figures(entry.throughput, seen)
    test = ""
    if (test_loss := seen.get("test_loss")) is not None:
        test = ", test loss " + ", ".join(
            [f"{test_loss:.4f}"] + [_figure(m, v) for m, v in _evaluated(seen, "test", metrics)])
        test += _perplexity(per_unit, "test")
    if (val_loss := seen.get("val_loss")) is not None:
        shown = _evaluated(seen, "val", metrics) or [("loss", val_loss)]
        test += ", validation " + ", ".join(_figure(m, v) for m, v in shown)
        test += _perplexity(per_unit, "val")
    notes = (["resumed"] if entry.resumed else []) + \
        (["profiled"] if entry.profiled else []) + (["warm-up"] if entry.warmup else [])
    if entry.partial:
        notes.append(f"partial, {entry.steps} of {plan.steps_per_epoch} steps")
    note = f" ({'; '.join(notes)})" if notes else ""
    if entry.noise.get("noise_scale") is not None:
        test += f", noise scale {entry.noise['noise_scale']:,.0f}"
    rate = cast(float, entry.throughput) * task.units_per_sample
    return (f"epoch {entry.epoch}/{plan.epochs}{note}: {entry.wall_time_s:.2f} s, "
            f"{rate:,.0f} {task.unit}/s, train loss {entry.train_loss:.4f}{test}")


def _sampled(cfg: TrainConfig, derived, split, task: tasks.Task) -> str:
    """What an evaluation of ``split`` covers, when it is a sample (--eval-batches)."""
    cover = coverage(cfg, len(split), derived.global_batch, task.units_per_sample)
    if cover.seed is None:
        return ""
    return (f" (each evaluation: {len(cover.indices)} of them, drawn by --seed {cover.seed}; "
            "--eval-batches 0 for all)")


def banner(cfg: TrainConfig, world: World, plan: Plan, bundle: DataBundle,
           task: tasks.Task) -> None:
    """Rank 0's lines before the first step: the task, world and strategy; the batch and
    learning rate; the steps and the data."""
    d, optim = plan.derived, cfg.optim
    threads = torch.get_num_threads()
    rule = "" if optim.lr_scaling == "none" else \
        f" ({optim.lr_scaling} scaling from base batch {d.base_batch})"
    warm = f", warm-up {optim.warmup_epochs:g} epochs" if optim.warmup_epochs else ""
    accumulate = cfg.batch.accumulate
    accumulated = f" x {accumulate} accumulation steps" if accumulate > 1 else ""
    print(f"parascale: {task.name}, {world.size} worker(s) on "
          f"{world.device.type} ({world.backend}, {world.launcher} launch, {threads} thread(s) "
          f"per worker), sync {cfg.strategy.sync}", flush=True)
    print(f"  batch {d.per_device_batch} per device x {world.size} workers{accumulated} = "
          f"{d.global_batch} global; lr {optim.lr:g} -> {d.effective_lr:g}{rule}{warm}",
          flush=True)
    held = f"{len(bundle.val)} validation samples" + _sampled(cfg, d, bundle.val, task) \
        if bundle.val is not None else ""
    evaluated = f"{len(bundle.test)} test samples" + _sampled(cfg, d, bundle.test, task) + \
        (f", {held}" if held else "") if cfg.evaluation.evaluate_test else \
        f"{held} (the test set is not evaluated)"
    print(f"  {plan.total_steps} steps: {plan.epochs} epoch(s) of {plan.steps_per_epoch} steps "
          f"over {len(bundle.train)} training samples; {evaluated}", flush=True)
