"""prediction.png: the predicted curves with the study's measured points over them.

Drawn like the report's plots (:mod:`parascale.report.plots`: a Figure and the Agg canvas, never
pyplot; the report's style and colours): left, efficiency against N; right, the predicted step
time split into compute and exposed communication, per mode. Measured points are filled markers
in the colour of their mode's curve.
"""
from __future__ import annotations

import io
from typing import TYPE_CHECKING

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from parascale.report.plots import COLORS, STYLE, worker_axis  # the report's N axis

if TYPE_CHECKING:
    from parascale.predict.prediction import Prediction


def render(pred: Prediction) -> bytes:
    """The PNG bytes."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(11.0, 4.4), layout="constrained")
        left, right = fig.subplots(1, 2)
        colors = {"weak": COLORS[0], "strong": COLORS[1]}
        ns = sorted({p.workers for ps in pred.curves.values() for p in ps}
                    | {c.workers for c in pred.checks})
        for mode, points in pred.curves.items():
            if not points:
                continue
            x = [p.workers for p in points]
            left.plot(x, [p.efficiency * 100 for p in points], color=colors[mode],
                      label=f"{mode}: predicted")
            right.plot(x, [p.step_s * 1e3 for p in points], color=colors[mode],
                       label=f"{mode}: step")
            right.plot(x, [p.work_s * 1e3 for p in points], color=colors[mode],
                       linestyle="--", label=f"{mode}: compute (no exchange)")
            right.plot(x, [p.exposed_s * 1e3 for p in points], color=colors[mode],
                       linestyle=":", label=f"{mode}: exposed communication")
            if points[0].tta_speedup is not None:
                left.plot(x, [p.tta_speedup / p.workers * 100 for p in points],
                          color=colors[mode], linestyle="--",
                          label=f"{mode}: time-to-accuracy efficiency (noise scale)")
        for mode in ("weak", "strong"):
            mine = [c for c in pred.checks if c.mode == mode]
            if mine:
                left.plot([c.workers for c in mine], [c.measured_efficiency * 100 for c in mine],
                          "o", color=colors[mode], label=f"{mode}: measured")
        for ax in (left, right):
            worker_axis(ax, ns)
            if len(ns) > 8:  # 1024, 2048, 4096 side by side would overlap
                ax.tick_params(axis="x", labelrotation=45)
            ax.legend()
        left.set_ylim(bottom=0)
        left.set_ylabel("efficiency (%)")
        left.set_title("Efficiency: predicted (lines), measured (points)")
        right.set_yscale("log")
        right.set_ylabel("time per step (ms, log scale)")
        right.set_title("Predicted step time and its exposed communication")
        fig.suptitle(_short(pred.subject), fontsize=9)
        FigureCanvasAgg(fig)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=110)
    return png.getvalue()


def _short(text: str, limit: int = 120) -> str:
    text = text.replace("$", r"\$")
    return text if len(text) <= limit else text[:limit - 1] + "…"
