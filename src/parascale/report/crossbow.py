"""The Crossbow paper's three figures, drawn from the runs that support them.

- time-to-accuracy against batch size (batch per learner under a strategy whose traits say it
  trains several learners per device, Crossbow's SMA; per device else), a line through runs
  alike but for their batch, a point for each other run;
- throughput gain per added learner: runs of such a strategy that differ only in learners per
  device, and the auto-tuner's own decisions against its threshold;
- test accuracy against training time for each count of learners.

Each is left out when no run supports it (no target, a single batch size, no runs of learners).
"""
from __future__ import annotations

from collections import defaultdict
from statistics import median

from matplotlib.ticker import MaxNLocator, NullLocator

from parascale import sync
from parascale.report.load import RunRecord
from parascale.report.tables import escaped


def _of_learners(record: RunRecord) -> bool:
    """Whether the record's strategy trains several learners per device (its traits)."""
    return sync.traits_of(record.sync).learners


def _learners(record: RunRecord) -> int | None:
    value = record.get("derived", "sync_options", "learners")
    return value if isinstance(value, int) else None


def _batch(record: RunRecord) -> int | None:
    """A learner's batch under a strategy of learners, the device's batch otherwise."""
    value = record.get("config", "batch_size") if _of_learners(record) else \
        record.get("derived", "per_device_batch")
    return value if isinstance(value, int) and value > 0 else None


def _series(record: RunRecord) -> str:
    """What runs alike but for their batch share: the strategy (and its learners), the scaling
    mode and the worker count. Runs that differ in any of these are not one trend in batch."""
    m = _learners(record)
    name = f"{record.sync}, {m} learner(s)" if _of_learners(record) and m else record.sync
    mode = f", {record.scaling}" if record.scaling else ""
    return f"{name}{mode}, {record.workers} worker(s)"


def _log2_axis(ax, values) -> None:
    values = sorted(set(values))
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, labels=[str(v) for v in values])
    ax.xaxis.set_minor_locator(NullLocator())


def tta_by_batch(records: list[RunRecord], figure, colors):
    """Time to the target against batch size: a line through runs alike but for their batch
    (:func:`_series`), a point for a series run at one batch only."""
    found: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    learners = False
    for r in records:
        tta, batch = r.get("time_to_accuracy"), _batch(r)
        if isinstance(tta, dict) and batch:
            found[_series(r)][batch].append(tta)
            learners = learners or _of_learners(r)
    targets = {(t["target"], t.get("metric", "accuracy"), t.get("higher_is_better", True))
               for by in found.values() for ts in by.values() for t in ts}
    if len({b for by in found.values() for b in by}) < 2 or len(targets) != 1:
        return None
    target, metric, higher = next(iter(targets))
    fig, ((ax,),) = figure()
    missed = []
    for i, (name, by_batch) in enumerate(sorted(found.items())):
        xs, ys = [], []
        for batch in sorted(by_batch):
            reached = [t["elapsed_s"] for t in by_batch[batch] if t.get("reached")]
            if len(reached) == len(by_batch[batch]):
                xs.append(batch)
                ys.append(median(reached))
            else:
                missed.append(f"{name} at {batch}")
        ax.plot(xs, ys, marker="o", color=colors[i % len(colors)], label=escaped(name))
    _log2_axis(ax, [b for by in found.values() for b in by])
    ax.set_xlabel(f"batch per learner ({', '.join(sync.with_trait(learners=True))}) or per "
                  "device (others), log-2 scale" if learners else
                  "batch per device (log-2 scale)")
    ax.set_ylabel(f"training time to {target:.0%} test accuracy (s)" if metric == "accuracy"
                  else f"training time to {metric} {'≥' if higher else '≤'} {target:g} (s)")
    ax.legend(title="strategy, scaling, workers", fontsize=7)
    title = "Time-to-accuracy against batch size"
    ax.set_title(title)
    caption = ("Median time to the target over the repeats (the first evaluation reaching it). "
               "A line joins runs alike but for their batch (strategy, scaling mode, workers); "
               "a point alone is a series run at one batch, not a trend. "
               + (f"Not reached in every repeat, left out: {'; '.join(missed)}." if missed
                  else "Every run reached it."))
    return fig, "crossbow_tta_by_batch", title, caption


def learner_gain(records: list[RunRecord], figure, colors):
    """Throughput against learners per device (relative to the fewest), and the tuner's gains."""
    many = [r for r in records if _of_learners(r) and _learners(r)]
    groups: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in many:
        x = r.get("summary", "steady_throughput")
        if isinstance(x, (int, float)) and r.get("config", "learners") != "auto":
            key = (r.study, r.model, r.workers, _batch(r))
            groups[key][_learners(r)].append(x)
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    tuned = [r for r in many if r.get("sync", "tuning")]
    if not groups and not tuned:
        return None
    fig, axes = figure(ncols=2 if groups and tuned else 1)
    panels = iter(axes[0])
    if groups:
        ax = next(panels)
        for i, (key, by_m) in enumerate(sorted(groups.items(), key=str)):
            ms = sorted(by_m)
            ref = median(by_m[ms[0]])
            ax.plot(ms, [median(by_m[m]) / ref for m in ms], marker="o",
                    color=colors[i % len(colors)],
                    label=escaped(f"{key[1]}, {key[2]} worker(s), batch {key[3]}"))
        _log2_axis(ax, [m for by_m in groups.values() for m in by_m])
        ax.set_xlabel("learners per device (log-2 scale)")
        ax.set_ylabel("throughput relative to the fewest learners")
        ax.legend(fontsize=7)
        ax.set_title("runs with a fixed count", fontsize=10)
    if tuned:
        ax = next(panels)
        for i, r in enumerate(tuned):
            steps = [d for d in r.get("sync", "tuning") if d.get("gain") is not None]
            ax.plot([d["learners"] for d in steps], [100 * d["gain"] for d in steps], marker="o",
                    color=colors[i % len(colors)], label=escaped(f"{r.model}, {r.workers} worker(s)"))
        threshold = tuned[0].get("config", "tune_threshold", default=0.1)
        ax.axhline(100 * threshold, linestyle="--", color="black", alpha=0.6,
                   label=f"threshold {threshold:.0%}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("learners per device at the tuning point")
        ax.set_ylabel("throughput gain over one learner fewer (%)")
        ax.legend(fontsize=7)
        ax.set_title("--learners auto: the tuner's decisions", fontsize=10)
    return (fig, "crossbow_learner_gain", "Throughput gain per added learner",
            "Left (when there are runs with a fixed count): median throughput against the "
            "learners per device, relative to the fewest measured. Right (when a run tuned its "
            "learners): the gain the tuner measured at each count; above the dashed threshold "
            "it added a learner, below it removed the last one and stopped.")


def accuracy_by_learners(records: list[RunRecord], figure, colors):
    """Test accuracy against training time, one colour per count of learners."""
    many = [r for r in records if _of_learners(r) and _learners(r)]
    counts = sorted({_learners(r) for r in many})
    if len(counts) < 2:
        return None
    fig, ((ax,),) = figure()
    labelled: set[int] = set()
    for r in many:
        m = _learners(r)
        points = [e for e in r.get("epochs", default=[]) if isinstance(e, dict)
                  and e.get("test_accuracy") is not None and e.get("elapsed_s") is not None]
        ax.plot([e["elapsed_s"] for e in points], [100 * e["test_accuracy"] for e in points],
                marker=".", color=colors[counts.index(m) % len(colors)],
                label=None if m in labelled else f"M={m}")
        labelled.add(m)
    targets = {t for r in many if isinstance(t := r.get("time_to_accuracy", "target"), float)
               and r.get("time_to_accuracy", "metric", default="accuracy") == "accuracy"}
    if len(targets) == 1:
        ax.axhline(100 * targets.pop(), linestyle="--", color="black", alpha=0.6, label="target")
    ax.set_xlabel("training time since first step (s; an auto-tuned run's tuning included)")
    ax.set_ylabel("test accuracy (%) of the central model")
    ax.legend(title="learners per device")
    return (fig, "crossbow_accuracy_by_learners", "Accuracy against time for each learner count",
            "Every SMA run's test accuracy against its training time, one colour per count of "
            "learners per device (all repeats drawn).")


BUILDERS = (tta_by_batch, learner_gain, accuracy_by_learners)
