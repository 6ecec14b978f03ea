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
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from parascale.files import atomic_write_bytes
from parascale.report import crossbow
from parascale.report.rows import SPLIT, GroupKey, Range, Row, grouped
from parascale.report.tables import escaped, loss_text

STYLE: Any = {  # matplotlib types its keys as one Literal per setting
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "font.size": 10, "legend.fontsize": 8, "svg.hashsalt": "parascale",  # stable SVG ids
}
COLORS = list(matplotlib.colormaps["tab10"].colors)  # type: ignore[attr-defined]
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
    builders = [_epoch_time, _throughput, _speedup, _efficiency, _lost_efficiency, _accuracy,
                _step_time, _memory, _comparison]
    records = [rec for rows_ in groups.values() for row in rows_ for rec in row.records]
    builders += [lambda *_, build=build: build(records, new_figure, COLORS)
                 for build in crossbow.BUILDERS]
    plots = []
    with matplotlib.rc_context(STYLE):
        for build in builders:
            made = build(groups, labels, colors)
            for fig, name, title, caption in made if isinstance(made, list) else \
                    [made] if made is not None else []:
                if fig is not None:
                    plots.append(Plot(name, title, caption, *png_and_svg(fig)))
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
    # escaped: a tab or newline from a record has no glyph (a warning per rendering)
    labels = {k: _short(escaped(" ".join(words.get(f, str)(getattr(k, f)) for f in varying)))
              for k in keys}
    # a '$' in a model name would switch matplotlib to math mode (and can fail to parse)
    return {k: label.replace("$", r"\$") for k, label in labels.items()}


def _short(text: str) -> str:
    """At most MAX_LABEL characters, keeping both ends (a module path and its function name)."""
    if len(text) <= MAX_LABEL:
        return text
    half = (MAX_LABEL - 1) // 2
    return text[:half] + "…" + text[-half:]


def png_and_svg(fig: Figure) -> tuple[bytes, bytes]:
    """``fig`` drawn as PNG and as SVG (the report's pages show one, link the other)."""
    FigureCanvasAgg(fig)
    png, svg = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    # the layout is solved now; solving it again for the SVG would double the time (slow CPUs)
    fig.set_layout_engine("none")
    fig.savefig(svg, format="svg", metadata={"Date": None})
    return png.getvalue(), svg.getvalue()


def new_figure(width: float = 7.0, height: float = 4.4, nrows: int = 1, ncols: int = 1):
    """A figure of ``nrows`` x ``ncols`` axes (always a 2-D array) in the report's layout."""
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def worker_axis(ax, ns: Iterable[int]) -> None:
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
    fig, axes = new_figure()
    ax = axes[0][0]
    for key, rows in groups.items():
        t = [r.epoch_time_s for r in rows]
        spread = [[r.epoch_time_s - r.epoch_time_min_s for r in rows],
                  [r.epoch_time_max_s - r.epoch_time_s for r in rows]]
        ax.errorbar([r.workers for r in rows], t, yerr=spread, marker="o", capsize=3,
                    color=colors[key], label=labels[key])
    worker_axis(ax, _all_ns(groups))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("steady epoch time (s)")
    ax.set_title("Epoch time by number of workers")
    ax.legend()
    return (fig, "epoch_time", "Epoch time",
            "Median wall time of one training epoch (slowest worker), warm-up epoch excluded; "
            "error bars span the repeats (min–max).")


def _throughput(groups, labels, colors):
    fig, axes = new_figure()
    ax = axes[0][0]
    # in the tasks' unit when every series counts the same one (tokens/s); else samples/s
    units = {(r.unit, r.units_per_sample) for rows in groups.values() for r in rows}
    unit, k = next(iter(units)) if len(units) == 1 else ("samples", 1.0)
    for key, rows in groups.items():
        ns = [r.workers for r in rows]
        x = [k * r.throughput for r in rows]
        spread = [[k * (r.throughput - r.throughput_min) for r in rows],
                  [k * (r.throughput_max - r.throughput) for r in rows]]
        ax.errorbar(ns, x, yerr=spread, marker="o", capsize=3, color=colors[key], label=labels[key])
        ref = rows[0]
        ax.plot(ns, [k * ref.reference_throughput * n / ref.reference_workers for n in ns],
                linestyle="--", color=colors[key], alpha=0.5)
        based = [r for r in rows if r.baseline_throughput is not None]
        if based:
            ranges = [_spread_range(r.baseline_spread) for r in based]
            ax.errorbar([r.workers for r in based], [k * r.baseline_throughput for r in based],
                        yerr=_yerr([k * r.baseline_throughput for r in based],
                                   [None if g is None else (k * g[0], k * g[1]) for g in ranges]),
                        marker="s", linestyle=":", capsize=3, color=colors[key], alpha=0.8,
                        label=f"{labels[key]}: baseline (no gradient exchange)")
    ax.plot([], [], linestyle="--", color="grey", label="ideal: X_ref · N / N_ref")
    worker_axis(ax, _all_ns(groups))
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"global throughput ({escaped(unit)}/s)")
    ax.set_title("Throughput by number of workers")
    ax.legend()
    return (fig, "throughput", "Throughput",
            "Training samples per second over all workers (total samples / slowest worker's "
            "time), warm-up excluded; error bars span the repeats (or one run's steady epochs). "
            "Dashed: perfect linear scaling from the reference run. Dotted squares: the contention "
            "baseline, the same processes without gradient exchange.")


def _speedup(groups, labels, colors):
    fig, axes = new_figure()
    ax = axes[0][0]
    ns = sorted(set(_all_ns(groups)))
    ax.plot(ns, ns, linestyle="--", color="black", alpha=0.6, label="ideal: S = N")
    for key, rows in groups.items():
        shown = [r for r in rows if r.speedup is not None]
        ax.errorbar([r.workers for r in shown], [r.speedup for r in shown],
                    yerr=_yerr([r.speedup for r in shown], [r.speedup_range for r in shown]),
                    marker="o", capsize=3, color=colors[key], label=labels[key])
    worker_axis(ax, ns)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("speedup S (× reference throughput)")
    ax.set_title("Speedup, " + _reference_label(groups))
    ax.legend()
    return (fig, "speedup", "Speedup",
            "S = N_ref · X_N / X_ref (X = global throughput). On the dashed line every added "
            "worker adds a full worker's throughput; above it is super-linear. Error bars: the "
            "conservative interval from the throughput ranges; a bar crossing S = N_ref is noise.")


def _efficiency(groups, labels, colors):
    fig, axes = new_figure()
    ax = axes[0][0]
    ax.axhline(100, linestyle="--", color="black", alpha=0.6, label="ideal: 100 %")
    top = 100.0
    for key, rows in groups.items():
        shown = [r for r in rows if r.efficiency is not None]
        e = [100 * r.efficiency for r in shown]
        ranges = [None if r.efficiency_range is None else
                  (100 * r.efficiency_range[0], 100 * r.efficiency_range[1]) for r in shown]
        top = max([top, *e, *(hi for _, hi in filter(None, ranges))])
        ax.errorbar([r.workers for r in shown], e, yerr=_yerr(e, ranges), marker="o", capsize=3,
                    color=colors[key], label=labels[key])
    worker_axis(ax, _all_ns(groups))
    ax.set_ylim(0, top * 1.1)  # not capped: super-linear points stay visible above 100 %
    ax.set_ylabel("parallel efficiency E = S / N (%)")
    ax.set_title("Scaling efficiency, " + _reference_label(groups))
    ax.legend()
    return (fig, "efficiency", "Efficiency",
            "E = S/N: the share of each worker's capacity that turns into extra throughput. "
            "Weak scaling: E = t1/tN; strong scaling: E = t1/(N·tN), t = time per step. Error "
            "bars: the conservative interval from the throughput ranges.")


def _accuracy(groups, labels, colors):
    curves = {key: [(r.workers, rec.get("epochs") or []) for r in rows for rec in r.records]
              for key, rows in groups.items()}
    if not any(e.get("test_accuracy") is not None for cs in curves.values() for _, ep in cs for e in ep):
        return None
    fig, axes = new_figure(9.0, 3.2 * len(groups) + 0.4, nrows=len(groups), ncols=2)
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
        target = _target(groups[key])
        if target is not None:
            for ax in (by_epoch, by_time):
                ax.axhline(100 * target, linestyle="--", color="black", alpha=0.6,
                           label=f"target {target:.0%}")
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
            "Right: the same against wall-clock training time, which is what scaling buys. "
            "Dashed: the target accuracy of time-to-accuracy, where one was set.")


def _step_time(groups, labels, colors):
    if all(r.step_p50_s is None for rows in groups.values() for r in rows):
        return None
    ncols = 1 if len(groups) == 1 else 2
    nrows = (len(groups) + ncols - 1) // ncols
    fig, axes = new_figure(7.0 if ncols == 1 else 10.0, 3.6 * nrows + 0.4, nrows=nrows, ncols=ncols)
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


_CATEGORIES = {"parameters_bytes": ("parameters", "////"), "gradients_bytes": ("gradients", "\\\\"),
               "optimizer_state_bytes": ("optimizer state", ".."),
               "activations_bytes": ("activations", "")}


def _memory(groups, labels, colors):
    """Memory per device against N, per series (per strategy when a study varies --sync): every
    rank's peak, and below it what rank 0 held by category, side by side at each N."""
    shown = {k: [r for r in rows if r.peak_per_rank] for k, rows in groups.items()}
    shown = {k: rows for k, rows in shown.items() if rows}
    if not shown:
        return None
    split = {k: [r for r in rows if r.memory_split] for k, rows in shown.items()}
    split = {k: rows for k, rows in split.items() if rows}
    fig, axes = new_figure(7.0, 7.6 if split else 4.4, nrows=2 if split else 1)
    ax = axes[0][0]
    mib = 1 << 20
    for key, rows in shown.items():
        ax.plot([r.workers for r in rows], [max(r.peak_per_rank) / mib for r in rows],
                marker="o", color=colors[key], label=f"{labels[key]}: largest rank")
        ranks = [(r.workers, p / mib) for r in rows for p in r.peak_per_rank]
        ax.scatter([n for n, _ in ranks], [p for _, p in ranks], marker="_", s=120,
                   color=colors[key], alpha=0.7)
    ax.scatter([], [], marker="_", s=120, color="grey", label="each rank")
    worker_axis(ax, [r.workers for rows in shown.values() for r in rows])
    ax.set_ylim(bottom=0)
    ax.set_ylabel("peak memory per device (MiB)")
    ax.set_title("Peak memory per device by number of workers")
    ax.legend(loc="lower right")  # the peaks sit high above a zero axis
    if split:
        _split_bars(axes[1][0], split, labels, colors)
    return (fig, "memory", "Memory per device",
            "Top: each rank's peak memory (resident set on a CPU, the CUDA allocator's peak on "
            "a GPU; median over the runs), the line through the largest rank's. "
            + ("Bottom: what rank 0 held after its first step, by category (its shards under "
               "a sharded --sync), one bar per series at each N; the rest of the peak is the "
               "interpreter, libraries, buffers and temporaries." if split else ""))


def _split_bars(ax, split, labels, colors) -> None:
    ns = sorted({r.workers for rows in split.values() for r in rows})
    width = 0.8 / len(split)
    for i, (key, rows) in enumerate(split.items()):
        xs = [ns.index(r.workers) + (i - (len(split) - 1) / 2) * width for r in rows]
        bottom = [0.0] * len(rows)
        for category in SPLIT:
            heights = [r.memory_split[category] / (1 << 20) for r in rows]
            ax.bar(xs, heights, width * 0.9, bottom=bottom, color=colors[key], alpha=0.55,
                   edgecolor="black", linewidth=0.5, hatch=_CATEGORIES[category][1])
            bottom = [b + h for b, h in zip(bottom, heights)]
    for category in SPLIT:
        ax.bar([0], [0], color="white", edgecolor="black", linewidth=0.5,
               hatch=_CATEGORIES[category][1], label=_CATEGORIES[category][0])
    ax.set_xticks(range(len(ns)), labels=[str(n) for n in ns])
    ax.set_xlabel("workers N (bars: one per series, in the legend's colours above)")
    ax.set_ylabel("held by rank 0 (MiB)")
    ax.set_title("What a device holds, by category")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them


def _median_of(row: Row, stat: str) -> float | None:
    values = [rec.get("steps", "phases", "step", stat) for rec in row.records]
    values = [v for v in values if isinstance(v, (int, float))]
    return median(values) if values else None


def _comparison(groups, labels, colors):
    """The BSC-style figure: series side by side per N, epoch time and efficiency; like with like
    only (one figure per scaling mode with two or more series: weak with weak)."""
    by_mode: dict[str | None, dict[GroupKey, list[Row]]] = {}
    for key, rows in groups.items():
        by_mode.setdefault(rows[0].mode, {})[key] = rows
    compared = {mode: series for mode, series in by_mode.items() if len(series) >= 2}
    return [_compare(series, labels, colors, mode, "comparison" if len(compared) == 1
                     else f"comparison_{mode or 'unknown'}")
            for mode, series in compared.items()]


def _compare(groups, labels, colors, mode, name):
    ns = sorted(set(_all_ns(groups)))
    fig, axes = new_figure(10.0, 4.4, nrows=1, ncols=2)
    by_time, by_eff = axes[0]
    width = 0.8 / len(groups)
    for j, (key, rows) in enumerate(groups.items()):
        pos = [ns.index(r.workers) - 0.4 + width * (j + 0.5) for r in rows]
        bars = by_time.bar(pos, [r.epoch_time_s for r in rows], width, color=colors[key],
                           label=labels[key])
        by_time.bar_label(bars, fmt="%.3g", fontsize=7)
        shown = [(p, r) for p, r in zip(pos, rows) if r.efficiency is not None]
        e = [100 * r.efficiency for _, r in shown]
        ranges = [None if r.efficiency_range is None else
                  (100 * r.efficiency_range[0], 100 * r.efficiency_range[1]) for _, r in shown]
        bars = by_eff.bar([p for p, _ in shown], e, width, color=colors[key], label=labels[key],
                          yerr=_yerr(e, ranges), capsize=2)
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
    what = f"{mode} scaling" if mode else "scaling mode not recorded"
    fig.suptitle(f"Comparison of the series ({what})")
    return (fig, name, f"Comparison ({what})",
            f"The {what} series side by side at every worker count, as in the BSC ResNet50 vs "
            "ResNet152 figure: the series whose efficiency stays higher scales better. Only "
            "series of one scaling mode are compared.")


def _lost_efficiency(groups, labels, colors):
    """Ideal -> contention baseline -> measured, for every series with baselines."""
    split = {key: [r for r in rows if r.contention_loss is not None]
             for key, rows in groups.items()}
    split = {key: rows for key, rows in split.items() if rows}
    if not split:
        return None
    fig, axes = new_figure(7.0, 3.4 * len(split) + 0.6, nrows=len(split), ncols=1)
    for (key, rows), (ax,) in zip(split.items(), axes):
        pos = list(range(len(rows)))
        base = [100 * (1 - r.contention_loss) for r in rows]
        base_ranges = [None if r.contention_range is None else
                       (100 * (1 - r.contention_range[1]), 100 * (1 - r.contention_range[0]))
                       for r in rows]
        measured = [100 * r.efficiency for r in rows]
        ranges = [None if r.efficiency_range is None else
                  (100 * r.efficiency_range[0], 100 * r.efficiency_range[1]) for r in rows]
        ax.bar([p - 0.2 for p in pos], base, 0.4, yerr=_yerr(base, base_ranges), capsize=3,
               color=colors[key], alpha=0.4, label="contention baseline (no exchange)")
        ax.bar([p + 0.2 for p in pos], measured, 0.4, yerr=_yerr(measured, ranges), capsize=3,
               color=colors[key], label="measured (with gradient exchange)")
        for p, r, b in zip(pos, rows, base):
            ax.annotate(f"sharing {loss_text(r.contention_loss, r.contention_range)}\n"
                        f"exchange {loss_text(r.exchange_loss, r.exchange_range)}",
                        (p, max(b, 100 * r.efficiency) + 4), ha="center", fontsize=7)
        ax.axhline(100, linestyle="--", color="black", alpha=0.6, label="ideal: 100 %")
        ax.set_xticks(pos, labels=[str(r.workers) for r in rows])
        ax.set_xlim(-0.7, len(rows) - 0.3)  # a single N would otherwise fill the axes
        ax.set_xlabel("workers N")
        ax.set_ylabel("efficiency (%)")
        ax.set_ylim(0, max(125.0, *[b + 25 for b in base]))
        ax.set_title(labels[key], fontsize=10)
        ax.legend(loc="lower left", fontsize=7)
    fig.suptitle("Where efficiency is lost: ideal → contention baseline → measured", fontsize=10)
    return (fig, "lost_efficiency", "Where efficiency is lost",
            "Ideal (100 %), the contention baseline's efficiency X_b/(N·X_1) (the same processes "
            "sharing the machine, no gradient exchange) and the measured efficiency X_s/(N·X_1). "
            "The first gap is the cost of N processes sharing the machine, the second the cost of "
            "gradient exchange, in points of efficiency; error bars are the conservative "
            "intervals, and a gap inside them is noise (marked ~).")


def _yerr(values: list[float], ranges: list[Range | None]):
    """Error bar lengths below and above each value; 0 where the spread is unknown."""
    low = [0.0 if r is None else max(0.0, v - r[0]) for v, r in zip(values, ranges)]
    high = [0.0 if r is None else max(0.0, r[1] - v) for v, r in zip(values, ranges)]
    return [low, high]


def _spread_range(spread) -> Range | None:
    return None if spread is None else (spread.low, spread.high)


def _target(rows: list[Row]) -> float | None:
    """The series' target accuracy, when its runs share one (a target on another metric is
    not drawn on an accuracy axis)."""
    targets = {r.tta_target for r in rows if r.tta_target is not None
               and r.tta_metric == "accuracy"}
    return next(iter(targets)) if len(targets) == 1 else None
