"""The advice as text (terminal), advice.json, advice.csv and advice.png (time to the goal
against devices, one line per strategy, the band shaded). Everything but :func:`write` is
pure; :func:`write` draws the plot before it writes anything, and writes each file atomically
as strict JSON or CSV."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from parascale.advise.forecast import Forecast
from parascale.advise.rank import Advice
from parascale.columns import aligned
from parascale.config import LR_SCALINGS

SCHEMA = "parascale.advice/1"
NAMES = {"json": "advice.json", "csv": "advice.csv", "png": "advice.png"}
SHOWN = 15  # rows of the ranked table printed (the files hold every candidate)
#: the rate is advise's own for each configuration: the trainer scales it no further
NO_SCALING = LR_SCALINGS[0]


def seconds(s: float) -> str:
    if not math.isfinite(s):
        return "-"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def run_options(f: Forecast, job: dict[str, Any], here: bool = True,
                threads: int | None = None, budget: bool = False) -> dict[str, Any]:
    """The train options that run ``f``'s configuration of ``job`` (``threads``: per worker,
    as measured here; ``budget``: for the steps its budget takes, rather than the job's)."""
    c = f.candidate
    chosen = {"batch_size": c.per_device_batch, "global_batch": None, "base_batch": None,
              "accumulate": c.accumulate, "sync": c.variant.name,
              "sync_options": dict(c.variant.changed), "lr": f.lr, "lr_scaling": NO_SCALING,
              "precision": c.precision}
    if here:
        chosen["workers"] = c.devices
        if threads is not None:
            chosen["threads"] = threads
    if f.warmup_steps:
        chosen["warmup_steps"] = f.warmup_steps
    if budget and f.timing is not None:
        chosen.update(steps=int(f.timing.steps), epochs=None)
    return {**job, **chosen}


def flags(f: Forecast, here: bool, threads: int | None = None, budget: bool = False) -> str:
    """What advise chose, as train's flags."""
    c = f.candidate
    parts = [f"--workers {c.devices}"] if here else []
    if budget and f.timing is not None:
        parts.append(f"--steps {int(f.timing.steps)}")
    if here and threads is not None:
        parts.append(f"--threads {threads}")
    parts += [f"--batch-size {c.per_device_batch}"]
    if c.accumulate > 1:
        parts.append(f"--accumulate {c.accumulate}")
    parts.append(f"--sync {c.variant.name}")
    from parascale import sync

    declared = {o.name: o for o in sync.get(c.variant.name).Settings.declared()}
    parts += [declared[k].given(v) for k, v in c.variant.changed]
    if c.precision != "fp32":
        parts.append(f"--precision {c.precision}")
    parts.append(f"--lr {f.lr:.4g} --lr-scaling {NO_SCALING}")
    if f.warmup_steps:
        parts.append(f"--warmup-steps {f.warmup_steps}")
    return " ".join(parts)


def describe(f: Forecast, advice: Advice) -> str:
    c = f.candidate
    acc = f" x {c.accumulate} accumulated" if c.accumulate > 1 else ""
    approx = "" if c.variant.exact else " (steps assumed as synchronous SGD's)"
    return (f"{c.devices} device(s) x {c.per_device_batch} per device{acc} (global "
            f"{c.global_batch}), --sync {c.variant.label}, {c.precision}, lr {f.lr:.4g}: "
            f"{seconds(f.time_s)} to the goal ({seconds(f.low_s)} to {seconds(f.high_s)}), "
            f"{f.device_hours:.3g} device-hours{approx}")


def table_rows(forecasts: list[Forecast], limit: int) -> list[list[str]]:
    rows = [["rank", "N", "b/dev", "acc", "global", "strategy", "lr", "step ms", "samples/s",
             "eff.", "GiB/dev", "epochs", "time to goal", "band", "dev-h", "note"]]
    for i, f in enumerate(forecasts[:limit], 1):
        c = f.candidate
        t = f.timing
        rows.append([
            str(i) if f.feasible else "-", str(c.devices), str(c.per_device_batch),
            str(c.accumulate), str(c.global_batch), c.variant.label, f"{f.lr:.3g}",
            f"{f.step.step_s * 1e3:.3g}" if f.step else "-", f"{f.throughput:,.0f}",
            f"{f.efficiency:.0%}", f"{f.memory_bytes / 2**30:.3g}",
            f"{t.epochs:g}" if t and t.epochs is not None else "-", seconds(f.time_s),
            f"{seconds(f.low_s)}-{seconds(f.high_s)}", f"{f.device_hours:.3g}"
            if math.isfinite(f.device_hours) else "-",
            f.why_not or ("" if c.variant.exact else "steps assumed")])
    return rows


def text(advice: Advice, job: dict[str, Any], here: bool) -> str:
    basis = advice.basis
    lines = [f"parascale advise: {basis.subject}", f"goal: {advice.goal}"]
    if basis.measured:
        lines += ["measured here:"] + [f"  {line}" for line in basis.measured]
    lines += ["", "inputs (how each is known):"]
    lines += [f"  {figure.line()}" for figure in basis.figures]
    space = advice.space
    feasible = sum(f.feasible for f in advice.forecasts)
    lines += ["", f"searched: devices {space['devices']}, per-device batches {space['batches']}, "
              f"accumulation up to {space['accumulate']}, {len(space['strategies'])} strategy "
              f"variant(s) ({', '.join(space['strategies'])}), precision "
              f"{', '.join(space['precisions'])}, learning-rate rule {advice.rule}: "
              f"{len(advice.forecasts)} configurations, {feasible} feasible", ""]
    lines.append(aligned(table_rows(advice.forecasts, SHOWN)))
    if len(advice.forecasts) > SHOWN:
        lines.append(f"({len(advice.forecasts) - SHOWN} more in advice.csv)")
    lines.append("")
    if advice.withheld is not None:
        lines.append(f"no recommendation: {advice.withheld}")
    else:
        assert advice.recommended is not None
        lines.append(f"recommended (fastest to the goal): {describe(advice.recommended, advice)}")
        lines.append("  " + command(advice.recommended, job, here, basis.threads,
                                    basis.stats.budget_samples is not None))
        if advice.assumed is not None:
            lines.append("possibly faster, if it needs no more steps than synchronous SGD "
                         "(its steps are assumed, not modelled; --verify measures it): "
                         + describe(advice.assumed, advice))
        if advice.cheapest is not None:
            lines.append(f"cheapest in device-hours: {describe(advice.cheapest, advice)}")
        if advice.limits:
            lines.append("what limits it: " + "; ".join(advice.limits))
    lines += [f"note: {note}" for note in basis.notes]
    return "\n".join(lines)


def command(f: Forecast, job: dict[str, Any], here: bool, threads: int | None = None,
            budget: bool = False) -> str:
    """The command that runs ``f``: here, with its workers; on a cluster, as each of its ranks
    runs it (under torchrun or srun, or ``parascale slurm train``)."""
    shown = {k: v for k, v in job.items() if not (budget and k in ("epochs", "steps"))}
    line = f"parascale train {_job_flags(shown)} {flags(f, here, threads, budget)}"
    return line if here else f"on {f.candidate.devices} devices, each rank: {line}"


#: the job's settings a configuration replaces
_CHOSEN = ("batch_size", "global_batch", "base_batch", "lr", "lr_scaling", "accumulate",
           "sync_options", "precision", "warmup_steps")


def _job_flags(job: dict[str, Any]) -> str:
    parts = []
    for key, value in job.items():
        if value is None or value is False or key in _CHOSEN:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            parts.append(f"{flag} {','.join(map(str, value))}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def to_dict(advice: Advice, job: dict[str, Any], here: bool) -> dict[str, Any]:
    def chosen(f: Forecast | None) -> dict[str, Any] | None:
        if f is None:
            return None
        budget = basis.stats.budget_samples is not None
        return {**f.to_dict(), "train": run_options(f, job, here, basis.threads, budget),
                "command": command(f, job, here, basis.threads, budget)}

    basis = advice.basis
    return {"schema": SCHEMA, "subject": basis.subject, "goal": advice.goal,
            "job": job, "rule": advice.rule, "space": advice.space,
            "inputs": [f.to_dict() for f in basis.figures], "measured": basis.measured,
            "notes": basis.notes, "recommended": chosen(advice.recommended),
            "cheapest": chosen(advice.cheapest), "assumed": chosen(advice.assumed),
            "limits": advice.limits,
            "withheld": advice.withheld, "candidates": [f.to_dict() for f in advice.forecasts],
            "checks": advice.checks}


def to_csv(advice: Advice) -> str:
    rows = [f.to_dict() for f in advice.forecasts]
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (" ".join(f"{a}={b}" for a, b in v.items())
                                 if isinstance(v, dict) else v) for k, v in row.items()})
    return buffer.getvalue()


def render(advice: Advice) -> bytes:
    """advice.png: per strategy variant, the best time to the goal at each device count, its
    band shaded; the recommendation starred."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from parascale.report.plots import COLORS, STYLE

    series: dict[str, dict[int, Forecast]] = {}
    for f in advice.forecasts:
        if not f.feasible:
            continue
        best = series.setdefault(f.candidate.variant.label, {})
        n = f.candidate.devices
        if n not in best or f.time_s < best[n].time_s:
            best[n] = f
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(8.0, 4.8), layout="constrained")
        ax = fig.subplots()
        for i, (label, points) in enumerate(sorted(series.items())):
            ns = sorted(points)
            color = COLORS[i % len(COLORS)]
            ax.plot(ns, [points[n].time_s for n in ns], marker="o", color=color, label=label)
            ax.fill_between(ns, [points[n].low_s for n in ns], [points[n].high_s for n in ns],
                            color=color, alpha=0.15, linewidth=0)
        if advice.recommended is not None:
            r = advice.recommended
            ax.plot([r.candidate.devices], [r.time_s], marker="*", markersize=16,
                    color="black", linestyle="none", label="recommended")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel("time to the goal (s)")
        ax.set_title(advice.goal)
        if series:
            ax.legend(fontsize="small")
        buffer = io.BytesIO()
        FigureCanvasAgg(fig).print_png(buffer)
    return buffer.getvalue()


def write(advice: Advice, job: dict[str, Any], out: str | Path, here: bool) -> list[Path]:
    """advice.json, advice.csv and advice.png into ``out``, each atomically."""
    from parascale import safejson
    from parascale.files import atomic_write_bytes, atomic_write_text

    png = render(advice)  # drawn first: a failure leaves nothing written
    data = safejson.dumps(to_dict(advice, job, here), indent=1) + "\n"
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    return [atomic_write_text(folder / NAMES["json"], data),
            atomic_write_text(folder / NAMES["csv"], to_csv(advice)),
            atomic_write_bytes(folder / NAMES["png"], png)]
