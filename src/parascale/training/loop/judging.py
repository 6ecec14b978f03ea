"""How an epoch is judged and said: time-to-target on any metric of the task, in its
direction, and rank 0's epoch line in the task's unit with its metrics."""
from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from parascale import tasks
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.runrecord import EpochEntry


def time_to_target(cfg: TrainConfig, directions: Mapping[str, bool | None], entry: EpochEntry,
                   tta: dict | None) -> dict | None:
    """The record's ``time_to_accuracy`` after ``entry``: the first evaluated epoch whose
    metric reached the target (at least it when higher is better, at most it otherwise), on
    the test set, or the validation split with --no-evaluate-test. ``directions``: whether
    a higher value is better, by metric (``Task.directions``)."""
    target = tasks.target_of(cfg)
    if target is None:
        return None
    if tta and tta["reached"]:
        return tta
    name, value = target
    higher = directions[name]
    split = "test" if cfg.evaluate_test else "val"
    seen = entry.metrics.get(f"{split}_{name}")
    reached = seen is not None and (seen >= value if higher else seen <= value)
    # an accuracy target's record reads as it always did; readers take accuracy, higher
    named = {} if name == "accuracy" else {"metric": name, "higher_is_better": higher}
    return {"target": value, **named, "reached": reached,
            "split": "test" if cfg.evaluate_test else "validation",
            "epoch": entry.epoch if reached else None,
            "elapsed_s": entry.elapsed_s if reached else None}


def _figure(name: str, value: float) -> str:
    return f"{name} {value:.2%}" if name == "accuracy" else f"{name} {value:.4f}"


def _perplexity(per_unit: dict[str, float], split: str) -> str:
    """A token model's perplexity beside its loss: a figure of the entry in its unit
    (runrecord.Unit), not a metric of the task, so the evaluation does not compute it twice."""
    value = per_unit.get(f"{split}_perplexity")
    return "" if value is None else f", perplexity {value:.2f}"


def epoch_line(entry: EpochEntry, plan: Plan, task: tasks.Task) -> str:
    metrics = [m.name for m in task.metrics]
    seen = entry.metrics
    per_unit = entry.unit.entry_figures(entry.throughput, seen)
    test = ""
    if seen.get("test_loss") is not None:
        test = ", test loss " + ", ".join(
            [f"{seen['test_loss']:.4f}"] + [_figure(m, seen[f"test_{m}"]) for m in metrics
                                            if seen.get(f"test_{m}") is not None])
        test += _perplexity(per_unit, "test")
    if seen.get("val_loss") is not None:
        shown = [m for m in metrics if seen.get(f"val_{m}") is not None] or ["loss"]
        test += ", validation " + ", ".join(_figure(m, seen[f"val_{m}"]) for m in shown)
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
