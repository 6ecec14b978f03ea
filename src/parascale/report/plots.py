"""Scaling plots, rendered to PNG and SVG in memory.

Figures are built with ``matplotlib.figure.Figure`` and the Agg canvas directly, never pyplot:
no display is needed, and nothing changes the backend or global state of a program (a notebook,
a test run) that imports the report. Every series keeps one colour across all plots, worker
counts go on a log-2 axis when they are all powers of two (labelled with the real N), and every
axis names its unit, so the pictures read on their own.
"""
from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from parascale.files import atomic_write_bytes
from parascale.report.tables import GroupKey, Row, grouped

STYLE = {
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "font.size": 10, "legend.fontsize": 8, "svg.hashsalt": "parascale",  # stable SVG ids
}
COLORS = list(matplotlib.colormaps["tab10"].colors)
# Legend and title text from records is cut to this: matplotlib lays text out glyph by glyph for
# every rendering, and a 9,000-character model name took 25 s of CPU to draw (20,000: 40 s).
MAX_LABEL = 80


@dataclass(frozen=True)
class Plot:
    """One chart: file stem, the words the HTML page shows with it, and both renderings."""

    name: str
    title: str
    caption: str
    png: bytes
    svg: bytes


def make_plots(rows: list[Row]) -> list[Plot]:
    """Every chart the rows support; charts without data (no step times, one series) are left out."""
    if not rows:
        return []
    groups = grouped(rows)
    labels = series_labels(list(groups))
    colors = {key: COLORS[i % len(COLORS)] for i, key in enumerate(groups)}
    builders = [_epoch_time, _throughput, _speedup, _efficiency, _accuracy, _step_time, _comparison]
    plots = []
    with matplotlib.rc_context(STYLE):
        for build in builders:
            made = build(groups, labels, colors)
            if made is not None:
                fig, name, title, caption = made
                plots.append(Plot(name, title, caption, *_render(fig)))
    return plots


def write_plots(plots: Iterable[Plot], out_dir: Path) -> list[Path]:
    """Write NAME.png and NAME.svg for each plot, each atomically."""
    paths = []
    for plot in plots:
        paths.append(atomic_write_bytes(out_dir / f"{plot.name}.png", plot.png))
        paths.append(atomic_write_bytes(out_dir / f"{plot.name}.svg", plot.svg))
    return paths


def series_labels(keys: list[GroupKey]) -> dict[GroupKey, str]:
    """Legend labels naming only what differs between series (the model always)."""
    fields = ["model", "dataset", "scaling", "sync", "variant", "study"]
    varying = [f for f in fields if f == "model" or len({getattr(k, f) for k in keys}) > 1]
    words = {"scaling": lambda v: f"{v or 'unknown'} scaling", "sync": lambda v: f"sync {v}",
             "study": lambda v: f"[{v}]", "variant": lambda v: f"({v})" if v else ""}
    labels = {k: _short(" ".join(words.get(f, str)(getattr(k, f)) for f in varying)) for k in keys}
    # a '$' in a model name would switch matplotlib to math mode (and can fail to parse)
    return {k: label.replace("$", r"\$") for k, label in labels.items()}


def _short(text: str) -> str:
    """At most MAX_LABEL characters, keeping both ends (a module path and its function name)."""
    if len(text) <= MAX_LABEL:
        return text
    half = (MAX_LABEL - 1) // 2
    return text[:half] + "…" + text[-half:]


def _render(fig: Figure) -> tuple[bytes, bytes]:
    FigureCanvasAgg(fig)
    png, svg = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    # the layout is solved now; solving it again for the SVG would double the time (slow CPUs)
    fig.set_layout_engine("none")
    fig.savefig(svg, format="svg", metadata={"Date": None})
    return png.getvalue(), svg.getvalue()


def _figure(width: float = 7.0, height: float = 4.4, nrows: int = 1, ncols: int = 1):
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _worker_axis(ax, ns: Iterable[int]) -> None:
    """N on x: log 2 when every N is a power of two, ticks exactly at the measured N."""
    ns = sorted(set(ns))
    log2 = len(ns) > 1 and all(n > 0 and n & (n - 1) == 0 for n in ns)
    if log2:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ns, labels=[str(n) for n in ns])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("workers N" + (" (log-2 scale)" if log2 else ""))


def _all_ns(groups: dict[GroupKey, list[Row]]) -> list[int]:
    return [r.workers for rows in groups.values() for r in rows]


def _reference_label(groups: dict[GroupKey, list[Row]]) -> str:
    refs = {rows[0].reference_workers for rows in groups.values()}
    return "relative to 1 worker" if refs == {1} else \
        "relative to the smallest N measured (" + ", ".join(f"N={n}" for n in sorted(refs)) + ")"


def _epoch_time(groups, labels, colors):
    fig, axes = _figure()
    ax = axes[0][0]
    for key, rows in groups.items():
        t = [r.epoch_time_s for r in rows]
        spread = [[r.epoch_time_s - r.epoch_time_min_s for r in rows],
                  [r.epoch_time_max_s - r.epoch_time_s for r in rows]]
        ax.errorbar([r.workers for r in rows], t, yerr=spread, marker="o", capsize=3,
                    color=colors[key], label=labels[key])
    _worker_axis(ax, _all_ns(groups))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("steady epoch time (s)")
    ax.set_title("Epoch time by number of workers")
    ax.legend()
    return (fig, "epoch_time", "Epoch time",
            "Median wall time of one training epoch (slowest worker), warm-up epoch excluded; "
            "error bars span the repeats (min–max).")


def _throughput(groups, labels, colors):
    fig, axes = _figure()
    ax = axes[0][0]
    for key, rows in groups.items():
        ns = [r.workers for r in rows]
        x = [r.throughput for r in rows]
        spread = [[r.throughput - r.throughput_min for r in rows],
                  [r.throughput_max - r.throughput for r in rows]]
        ax.errorbar(ns, x, yerr=spread, marker="o", capsize=3, color=colors[key], label=labels[key])
        ref = rows[0]
        ax.plot(ns, [ref.reference_throughput * n / ref.reference_workers for n in ns],
                linestyle="--", color=colors[key], alpha=0.5)
    ax.plot([], [], linestyle="--", color="grey", label="ideal: X_ref · N / N_ref")
    _worker_axis(ax, _all_ns(groups))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("global throughput (samples/s)")
    ax.set_title("Throughput by number of workers")
    ax.legend()
    return (fig, "throughput", "Throughput",
            "Training samples per second over all workers (total samples / slowest worker's "
            "time), warm-up excluded. Dashed: perfect linear scaling from the reference run.")


def _speedup(groups, labels, colors):
    fig, axes = _figure()
    ax = axes[0][0]
    ns = sorted(set(_all_ns(groups)))
    ax.plot(ns, ns, linestyle="--", color="black", alpha=0.6, label="ideal: S = N")
    for key, rows in groups.items():
        ax.plot([r.workers for r in rows], [r.speedup for r in rows], marker="o",
                color=colors[key], label=labels[key])
    _worker_axis(ax, ns)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("speedup S (× reference throughput)")
    ax.set_title("Speedup, " + _reference_label(groups))
    ax.legend()
    return (fig, "speedup", "Speedup",
            "S = N_ref · X_N / X_ref (X = global throughput). On the dashed line every added "
            "worker adds a full worker's throughput; above it is super-linear.")


def _efficiency(groups, labels, colors):
    fig, axes = _figure()
    ax = axes[0][0]
    ax.axhline(100, linestyle="--", color="black", alpha=0.6, label="ideal: 100 %")
    top = 100.0
    for key, rows in groups.items():
        e = [100 * r.efficiency for r in rows]
        top = max(top, *e)
        ax.plot([r.workers for r in rows], e, marker="o", color=colors[key], label=labels[key])
    _worker_axis(ax, _all_ns(groups))
    ax.set_ylim(0, top * 1.1)  # not capped: super-linear points stay visible above 100 %
    ax.set_ylabel("parallel efficiency E = S / N (%)")
    ax.set_title("Scaling efficiency, " + _reference_label(groups))
    ax.legend()
    return (fig, "efficiency", "Efficiency",
            "E = S/N: the share of each worker's capacity that turns into extra throughput. "
            "Weak scaling: E = t1/tN; strong scaling: E = t1/(N·tN), t = time per step.")


def _accuracy(groups, labels, colors):
    curves = {key: [(r.workers, rec.get("epochs") or []) for r in rows for rec in r.records]
              for key, rows in groups.items()}
    if not any(e.get("test_accuracy") is not None for cs in curves.values() for _, ep in cs for e in ep):
        return None
    fig, axes = _figure(9.0, 3.2 * len(groups) + 0.4, nrows=len(groups), ncols=2)
    for (key, runs), (by_epoch, by_time) in zip(curves.items(), axes):
        order = sorted({n for n, _ in runs})
        seen: set[int] = set()
        for n, epochs in runs:
            points = [e for e in epochs if e.get("test_accuracy") is not None]
            color = COLORS[order.index(n) % len(COLORS)]
            label = None if n in seen else f"N={n}"
            seen.add(n)
            acc = [100 * e["test_accuracy"] for e in points]
            by_epoch.plot([e.get("epoch") for e in points], acc, marker=".", color=color, label=label)
            by_time.plot([e.get("elapsed_s") for e in points], acc, marker=".", color=color, label=label)
        by_epoch.set_title(f"{labels[key]}: by epoch", fontsize=10)
        by_time.set_title(f"{labels[key]}: by training time", fontsize=10)
        by_epoch.set_xlabel("epoch")
        by_epoch.xaxis.set_major_locator(MaxNLocator(integer=True))
        by_time.set_xlabel("training time since first step (s)")
        for ax in (by_epoch, by_time):
            ax.set_ylabel("test accuracy (%)")
            ax.legend(title="workers")
    fig.suptitle("Test accuracy per configuration (statistical efficiency)")
    return (fig, "accuracy", "Test accuracy by epoch and by time",
            "Left: accuracy reached per epoch (larger global batches often need more epochs). "
            "Right: the same against wall-clock training time, which is what scaling buys.")


def _step_time(groups, labels, colors):
    if all(r.step_p50_s is None for rows in groups.values() for r in rows):
        return None
    ncols = 1 if len(groups) == 1 else 2
    nrows = (len(groups) + ncols - 1) // ncols
    fig, axes = _figure(7.0 if ncols == 1 else 10.0, 3.6 * nrows + 0.4, nrows=nrows, ncols=ncols)
    flat = [ax for line in axes for ax in line]
    for ax, (key, rows) in zip(flat, groups.items()):
        for i, r in enumerate(rows):
            if r.step_p50_s is None:
                continue
            worst = _median_of(r, "max") or r.step_p95_s or r.step_p50_s
            p95 = r.step_p95_s or r.step_p50_s
            ms = 1000.0
            ax.vlines(i, p95 * ms, worst * ms, color=colors[key])
            ax.bar(i, (p95 - r.step_p50_s) * ms, bottom=r.step_p50_s * ms, width=0.5,
                   color=colors[key], alpha=0.35, edgecolor=colors[key])
            ax.hlines(r.step_p50_s * ms, i - 0.25, i + 0.25, color=colors[key], linewidth=2.5)
            ranks = [p["step_p50_s"] * ms for rec in r.records
                     for p in rec.get("steps", "per_rank", default=[]) if p.get("step_p50_s")]
            ax.plot([i + 0.33] * len(ranks), ranks, linestyle="none", marker=".", color="grey")
        ax.set_xticks(range(len(rows)), labels=[str(r.workers) for r in rows])
        ax.set_xlabel("workers N")
        ax.set_ylabel("time per step (ms)")
        ax.set_ylim(bottom=0)
        ax.set_title(labels[key], fontsize=10)
    for ax in flat[len(groups):]:
        ax.set_visible(False)
    fig.suptitle("Step-time distribution: line = median, box = median to p95, whisker to max, "
                 "grey = each rank's median", fontsize=9)
    return (fig, "step_time", "Step-time distribution",
            "Time of one training step (data, forward, backward, optimizer) over every rank, "
            "warm-up epoch excluded. A long box or whisker means stragglers or jitter.")


def _median_of(row: Row, stat: str) -> float | None:
    values = [rec.get("steps", "phases", "step", stat) for rec in row.records]
    values = [v for v in values if isinstance(v, (int, float))]
    return median(values) if values else None


def _comparison(groups, labels, colors):
    """The BSC-style figure: series side by side per N, epoch time and efficiency."""
    if len(groups) < 2:
        return None
    ns = sorted(set(_all_ns(groups)))
    fig, axes = _figure(10.0, 4.4, nrows=1, ncols=2)
    by_time, by_eff = axes[0]
    width = 0.8 / len(groups)
    for j, (key, rows) in enumerate(groups.items()):
        pos = [ns.index(r.workers) - 0.4 + width * (j + 0.5) for r in rows]
        bars = by_time.bar(pos, [r.epoch_time_s for r in rows], width, color=colors[key],
                           label=labels[key])
        by_time.bar_label(bars, fmt="%.3g", fontsize=7)
        bars = by_eff.bar(pos, [100 * r.efficiency for r in rows], width, color=colors[key],
                          label=labels[key])
        by_eff.bar_label(bars, fmt="%.0f", fontsize=7)
    by_eff.axhline(100, linestyle="--", color="black", alpha=0.6)
    for ax in (by_time, by_eff):
        ax.set_xticks(range(len(ns)), labels=[str(n) for n in ns])
        ax.set_xlabel("workers N")
    # one legend below both panels: inside, it would cover the tallest bars or the 100 % line
    fig.legend(*by_time.get_legend_handles_labels(), loc="outside lower center",
               ncols=min(len(groups), 4))
    by_time.set_ylabel("steady epoch time (s)")
    by_time.set_title("Epoch time")
    by_eff.set_ylabel("parallel efficiency (%)")
    by_eff.set_title("Efficiency, " + _reference_label(groups), fontsize=9)
    fig.suptitle("Comparison of the series")
    return (fig, "comparison", "Comparison",
            "Each series side by side at every worker count, as in the BSC ResNet50 vs ResNet152 "
            "figure: the series whose efficiency stays higher scales better.")
