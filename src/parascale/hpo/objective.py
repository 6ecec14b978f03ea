"""What a search optimises: the best validation accuracy (``accuracy``), the time to a
validation accuracy (``tta``), or any metric of the task by name (``loss``, a task's ``mae``),
in that metric's direction. A trial's value is its best evaluated epoch's."""
from __future__ import annotations

import math
from typing import Any

from parascale.errors import UsageError

SPECIAL = ("accuracy", "tta")


def resolve(objective: str | None, directions: dict[str, bool]) -> tuple[str, bool]:
    """The objective (accuracy when not given) and whether the search maximises it; one line
    when the task has no such metric (``directions``: each metric of the task and whether
    higher is better)."""
    metrics = ", ".join(directions)
    suggested = next((name for name in directions if name != "loss"), "loss")
    if "accuracy" not in directions and objective in (None, "tta"):
        said = "without --objective a search maximises the validation accuracy" \
            if objective is None else "--objective tta is the time to reach a validation " \
            "accuracy (--target)"
        raise UsageError(f"{said}, and this task has no metric 'accuracy' (its metrics: "
                         f"{metrics}): give --objective NAME, e.g. --objective {suggested}")
    if objective is None:
        return "accuracy", True
    if objective == "tta":
        return objective, False
    if objective not in directions:
        raise UsageError(f"--objective {objective!r} is not a metric of this task; give "
                         f"accuracy, tta, or one of its metrics: {metrics}")
    return objective, directions[objective]


def metric(objective: str) -> str:
    """The metric judged at each epoch: tta watches the validation accuracy."""
    return "accuracy" if objective == "tta" else objective


def best_of(record: dict, objective: str, maximize: bool) -> float | None:
    """The trial's best validation value of the objective's metric, in its direction."""
    key = f"val_{metric(objective)}"
    seen = [e[key] for e in record["epochs"] if isinstance(e.get(key), (int, float))]
    if not seen:
        return None
    return max(seen) if maximize or objective == "tta" else min(seen)


def value_of(record: dict, objective: str, maximize: bool) -> float | None:
    """Best validation value, or seconds to the target (infinite when never reached)."""
    if objective == "tta":
        tta = record.get("time_to_accuracy") or {}
        return tta["elapsed_s"] if tta.get("reached") else math.inf
    return best_of(record, objective, maximize)


def shown(objective: str, value: Any) -> str:
    """A value of the objective as the table shows it."""
    if value is None:
        return ""
    if objective == "accuracy":
        return f"{value:.2%}"
    if objective == "tta":
        return "not reached" if math.isinf(value) else f"{value:.1f} s"
    return f"{value:.4g}"


def describe(objective: str, value: float | None) -> str:
    if value is None:
        return "no value"
    if objective == "tta":
        return "target not reached" if math.isinf(value) else f"target reached in {value:.1f} s"
    return f"validation {objective} {shown(objective, value)}"
