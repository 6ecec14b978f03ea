"""Time-to-accuracy from a run's recorded curve, for every run, not only those trained with a
target.

A run records, for each epoch, the training time when its evaluation ended (``elapsed_s``) and
the test accuracy then (``test_accuracy``; None when that epoch was not evaluated). The time to
a target is the first evaluation at or above it: a measured point, so an upper bound at the
granularity of the evaluations. Nothing is interpolated between evaluations (accuracy need not
rise in a straight line between them) and nothing is extrapolated beyond the last one: a run
whose evaluations never reached the target has not reached it, whatever its trend.
"""
from __future__ import annotations

from typing import Any

from parascale.report.load import Loaded


def time_to_target(epochs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """The trainer's ``time_to_accuracy`` shape computed from ``epochs``, plus ``best`` (the
    highest accuracy evaluated, or None) and ``evaluated`` (how many evaluations there were)."""
    tested = [e for e in epochs if isinstance(e.get("test_accuracy"), (int, float))
              and isinstance(e.get("elapsed_s"), (int, float))]
    found = {"target": target, "reached": False, "epoch": None, "elapsed_s": None,
             "best": max((e["test_accuracy"] for e in tested), default=None),
             "evaluated": len(tested)}
    for entry in tested:
        if entry["test_accuracy"] >= target:
            return {**found, "reached": True, "epoch": entry.get("epoch"),
                    "elapsed_s": entry["elapsed_s"]}
    return found


def apply_target(loaded: Loaded, target: float | None) -> None:
    """Give every finished run a time-to-accuracy from its curve: for ``target`` when given (it
    replaces the runs' own), else for the target a run was trained with when its record lacks
    one. Only the loaded copies change; the record files are never written."""
    for record in loaded.ok:
        own = (record.data.get("config") or {}).get("target_accuracy")
        goal = target if target is not None else own
        if goal is None or (target is None and isinstance(record.data.get("time_to_accuracy"),
                                                          dict)):
            continue
        epochs = record.data.get("epochs")
        if isinstance(epochs, list) and epochs and any(
                isinstance(e, dict) and e.get("test_accuracy") is not None for e in epochs):
            record.data["time_to_accuracy"] = time_to_target(
                [e for e in epochs if isinstance(e, dict)], goal)
