"""A search's figures, in the report's style: the objective by trial (with the best so far),
and validation accuracy and training time against the global batch (seed 004's figure)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

from parascale.hpo import objective as objectives
from parascale.report.plots import COLORS, STYLE, Plot, new_figure, png_and_svg, write_plots

MARKERS = {"complete": ("o", COLORS[0]), "pruned": ("x", COLORS[1]), "fail": ("v", COLORS[3])}


def make(table: list[dict[str, Any]], objective: str, maximize: bool = True) -> list[Plot]:
    """``maximize``: the objective's direction, for a metric's objective (accuracy's and
    tta's is known)."""
    plots = []
    with matplotlib.rc_context(STYLE):
        for build in (_by_trial, _by_batch):
            made = build(table, objective, maximize) if build is _by_trial else \
                build(table, objective)
            if made is not None:
                fig, name, title, caption = made
                plots.append(Plot(name, title, caption, *png_and_svg(fig)))
    return plots


def write(table: list[dict[str, Any]], objective: str, folder: Path,
          maximize: bool = True) -> list[Path]:
    return write_plots(make(table, objective, maximize), folder)


def _value(row: dict[str, Any], objective: str) -> float | None:
    """What the trial scored: its objective, or a pruned trial's best validation value."""
    value = row["value"]
    if value is None and objective != "tta":
        value = row.get("val_best")
    if objective == "accuracy":
        return None if value is None else 100 * value
    return None if value is None or math.isinf(value) else value


def _by_trial(table, objective, maximize=True):
    shown = [r for r in table if r["state"] in ("complete", "pruned")]
    if not shown:
        return None
    fig, axes = new_figure()
    ax = axes[0][0]
    for state in ("complete", "pruned"):
        points = [(r["trial"], _value(r, objective)) for r in shown if r["state"] == state]
        points = [(x, y) for x, y in points if y is not None]
        if points:
            marker, color = MARKERS[state]
            label = state if state == "complete" else "pruned (best value when stopped)"
            ax.scatter(*zip(*points), marker=marker, color=color, label=label)
    best, xs, ys = None, [], []
    for row in sorted(shown, key=lambda r: r["trial"]):
        value = _value(row, objective) if row["state"] == "complete" else None
        higher = objective == "accuracy" or (objective != "tta" and maximize)
        if value is not None and (best is None or (value > best if higher else value < best)):
            best = value
        if best is not None:
            xs.append(row["trial"])
            ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="black", linewidth=1, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("best validation accuracy (%)" if objective == "accuracy"
                  else "time to the target (s)" if objective == "tta"
                  else f"best validation {objective}")
    ax.legend()
    caption = ("Each trial's objective in the order the trials started; the line is the best "
               "complete trial so far." + (" Trials that never reached the target are left out."
                                           if objective == "tta" else ""))
    return fig, "hpo-objective", "Objective by trial", caption


def _by_batch(table, objective):
    done = [r for r in table if r["state"] in ("complete", "pruned") and r["global_batch"]]
    if len({r["global_batch"] for r in done}) < 2:
        return None  # the batch was not searched: nothing to plot against
    fig, axes = new_figure(9.0, 4.0, ncols=2)
    metric = objectives.metric(objective)
    scale = 100 if metric == "accuracy" else 1
    for state in ("complete", "pruned"):
        marker, color = MARKERS[state]
        mine = [r for r in done if r["state"] == state]
        acc = [(r["global_batch"], scale * r["val_best"]) for r in mine
               if r.get("val_best") is not None]
        time = [(r["global_batch"], r["training_s"]) for r in mine if r["training_s"]]
        if acc:
            axes[0][0].scatter(*zip(*acc), marker=marker, color=color, label=state)
        if time:
            axes[0][1].scatter(*zip(*time), marker=marker, color=color, label=state)
    batches = sorted({r["global_batch"] for r in done})
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, labels=[str(b) for b in batches])
        ax.minorticks_off()
        ax.set_xlabel("global batch (samples)")
        ax.legend()
    axes[0][0].set_ylabel("best validation accuracy (%)" if metric == "accuracy"
                          else f"best validation {metric}")
    axes[0][1].set_ylabel("training time (s)")
    caption = (f"Validation {metric} and training time of each trial against its global batch; "
               "pruned trials stopped early, so their times are shorter.")
    return fig, "hpo-batch", f"{metric.capitalize()} and training time against the batch", \
        caption
