"""Time-to-target from a run's recorded curve, for every run, not only those trained with a
target, on any metric the records hold, in its direction.

A run records, for each epoch, the training time when its evaluation ended (``elapsed_s``) and
each metric then (``test_<name>``, or ``val_<name>`` with --no-evaluate-test; None when that
epoch was not evaluated). The time to a target is the first evaluation at or above it (at or
below it for a lower-is-better metric such as the loss): a measured point, so an upper bound at
the granularity of the evaluations. Nothing is interpolated between evaluations (a metric need
not move in a straight line between them) and nothing is extrapolated beyond the last one: a run
whose evaluations never reached the target has not reached it, whatever its trend.
"""
from __future__ import annotations

from typing import Any

from parascale.errors import UsageError
from parascale.report.load import Loaded

ACCURACY = "accuracy"
# the built-in tasks' directions (tasks.BUILTIN_METRICS), kept here so that a report loads
# without torch
BUILTIN = {"loss": False, ACCURACY: True}


def time_to_target(epochs: list[dict[str, Any]], target: float, metric: str = ACCURACY,
                   higher: bool = True) -> dict[str, Any]:
    """The trainer's ``time_to_accuracy`` shape computed from ``epochs``, plus ``best`` (the
    best value evaluated, or None) and ``evaluated`` (how many evaluations there were)."""
    key, split = _key(epochs, metric)
    tested = [e for e in epochs if isinstance(e.get(key), (int, float))
              and isinstance(e.get("elapsed_s"), (int, float))]
    values = [e[key] for e in tested]
    # an accuracy target's shape reads as the trainer's does: no metric, higher is better
    named = {} if metric == ACCURACY else {"metric": metric, "higher_is_better": higher}
    found = {"target": target, **named, "reached": False, "split": split, "epoch": None,
             "elapsed_s": None, "best": (max if higher else min)(values, default=None),
             "evaluated": len(tested)}
    for entry in tested:
        if entry[key] >= target if higher else entry[key] <= target:
            return {**found, "reached": True, "epoch": entry.get("epoch"),
                    "elapsed_s": entry["elapsed_s"]}
    return found


def _key(epochs: list[dict[str, Any]], metric: str) -> tuple[str, str]:
    """The test set's curve of ``metric`` when the run evaluated it, else validation's."""
    if any(e.get(f"test_{metric}") is not None for e in epochs) or not any(
            e.get(f"val_{metric}") is not None for e in epochs):
        return f"test_{metric}", "test"
    return f"val_{metric}", "validation"


def _has(record, metric: str) -> bool:
    epochs = record.data.get("epochs")
    return isinstance(epochs, list) and any(
        isinstance(e, dict) and (e.get(f"test_{metric}") is not None
                                 or e.get(f"val_{metric}") is not None) for e in epochs)


def _direction(record, metric: str) -> bool | None:
    """Whether higher is better for ``metric``: the record's task says, else the built-ins."""
    task = record.data.get("task")
    for m in (task.get("metrics") if isinstance(task, dict) else None) or []:
        if isinstance(m, dict) and m.get("name") == metric:
            return m.get("higher_is_better") if isinstance(m.get("higher_is_better"),
                                                           bool) else None
    return BUILTIN.get(metric)


def apply_target(loaded: Loaded, target: float | tuple[str, float] | None) -> None:
    """Give every finished run a time-to-target from its curve: for ``target`` (a test accuracy,
    or ``(metric, value)``) when given (it replaces the runs' own), else for the accuracy target
    a run was trained with when its record lacks one. A metric no record holds is refused in one
    line. Only the loaded copies change; the record files are never written."""
    metric, value = (ACCURACY, target) if not isinstance(target, tuple) else target
    if target is not None and not any(_has(r, metric) for r in loaded.ok) and loaded.ok:
        recorded = sorted({k.split("_", 1)[1] for r in loaded.ok
                           for e in (r.data.get("epochs") or []) if isinstance(e, dict)
                           for k in e if k.startswith(("test_", "val_"))
                           and isinstance(e[k], (int, float))})
        raise UsageError(f"report: no run record has the metric {metric!r} to reach a target "
                         f"on; recorded: {', '.join(recorded) or 'none'}")
    for record in loaded.ok:
        own = (record.data.get("config") or {}).get("target_accuracy")
        goal = value if target is not None else own
        if goal is None or (target is None and isinstance(record.data.get("time_to_accuracy"),
                                                          dict)):
            continue
        higher = _direction(record, metric)
        if higher is None:
            raise UsageError(f"report: the metric {metric!r} has no direction in "
                             f"{record.path}; its task must say whether higher is better")
        if _has(record, metric):
            record.data["time_to_accuracy"] = time_to_target(
                [e for e in record.data["epochs"] if isinstance(e, dict)], goal, metric, higher)
