"""Time-to-target: the first evaluated epoch whose metric reached the target, on any metric of
the task and in its direction (the record's ``time_to_accuracy``)."""
from __future__ import annotations

from collections.abc import Mapping

from parascale import tasks
from parascale.config import EvaluationConfig
from parascale.runrecord import EpochEntry


def time_to_target(evaluation: EvaluationConfig, directions: Mapping[str, bool | None],
                   entry: EpochEntry, tta: dict | None) -> dict | None:
    """The record's ``time_to_accuracy`` after ``entry``: the first evaluated epoch whose
    metric reached the target (at least it when higher is better, at most it otherwise), on
    the test set, or the validation split with --no-evaluate-test. ``directions``: whether
    a higher value is better, by metric (``Task.directions``)."""
    target = tasks.target_of(evaluation)
    if target is None:
        return None
    if tta and tta["reached"]:
        return tta
    name, value = target
    higher = directions[name]
    split = "test" if evaluation.evaluate_test else "val"
    seen = entry.metrics.get(f"{split}_{name}")
    reached = seen is not None and (seen >= value if higher else seen <= value)
    # an accuracy target's record reads as it always did; readers take accuracy, higher
    named = {} if name == "accuracy" else {"metric": name, "higher_is_better": higher}
    # evaluated on a sample of the split (--eval-batches): the target is that sample's
    cover = entry.evaluation.get(split)
    sample = {"sample": cover} if cover and cover["samples"] < cover["of"] else {}
    return {"target": value, **named, "reached": reached,
            "split": "test" if evaluation.evaluate_test else "validation",
            "epoch": entry.epoch if reached else None,
            "elapsed_s": entry.elapsed_s if reached else None, **sample}
