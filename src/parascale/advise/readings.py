"""From what was measured here, read from records or given by hand to the :class:`Basis` every
prediction rests on, each figure marked measured, fitted, counted, given or assumed.

- Speed here: predict's calibration (``predict.calibrate.build``) over the probes and the
  pilot (compute(b) fitted over the probes' batches, the optimizer's time, the per-step work's
  quantiles for the wait, the gradient's bytes from the pilot's exchange, the overlap from the
  pilot and the measured link), with the baselines' compute at each N
  (``predict.contention``).
- Speed on a cluster: the model's FLOPs per sample (counted by torch in a run here, or given)
  over the device's peak (its datasheet, ``--gpu``, or ``--peak-tflops``) times an assumed
  model-FLOPs utilisation (``--mfu``, default 0.4, band ±50 %); the links are predict's presets
  (or a comm record for inside a node); the overlap predict's assumed 2/3 on GPUs.
- Memory: the pilot's measured split (predict/memory.py's bytes per parameter and the
  activations, per sample), or the parameters given with the optimizer's bytes counted.
- Statistics: the pilot's noise scale with its jackknife standard error and steps, and its
  steps to the target, between the evaluation before the target and the one that reached it
  (the metric interpolated linearly between them for the central figure).
"""
from __future__ import annotations

import math
from statistics import median
from typing import Any, cast

from parascale import sync
from parascale.advise.forecast import Basis
from parascale.advise.measure import Readings
from parascale.advise.model import Figure, Memory, Speed, Statistics
from parascale.advise.options import Options
from parascale.errors import UsageError
from parascale.predict import calibrate, contention, costs
from parascale.predict import memory as memory_model
from parascale.predict.interconnect import Link, fit_comm, preset
from parascale.predict.model import Input, Model, Work
from parascale.report.load import RunRecord

#: assumed model-FLOPs utilisation of a cluster's device without a run on one, and its band
MFU = 0.4
MFU_BAND = 0.5
#: the work's band where records of the job on the cluster's device measured it
RECORDS_BAND = 0.1
#: a measured link's band at least this (gloo's algorithm changes with the size)
LINK_BAND = 0.1
#: a preset's figures may be off this many times either way
PRESET_BAND = 2.0


def figure(i: Input) -> Figure:
    return Figure(i.name, i.value, i.unit, i.how, i.source)


def reference(flat: dict[str, Any]) -> tuple[int, float]:
    """The job's reference: its global batch on one device (the rate is stated there, or at
    --base-batch), and its rate."""
    from parascale.batch import DEFAULT_BATCH

    batch = flat.get("base_batch") or flat.get("global_batch") or flat.get("batch_size") \
        or DEFAULT_BATCH
    return int(batch), float(flat["lr"])


def pilot_batch(batch: int) -> int:
    """The pilot's global batch: the reference, made even for its two workers."""
    return max(2, batch + batch % 2)


# -- speed -----------------------------------------------------------------------------------

def local_speed(readings: Readings, link: Link | None, notes: list[str],
                figures: list[Figure]) -> Model:
    """predict's model calibrated on the probes (and the pilot), with the baselines' compute."""
    records = [*readings.probes, *([readings.pilot] if readings.pilot else [])]
    strategy = costs.strategy(sync.DEFAULT)
    link = link or preset("loopback")
    model = calibrate.build(records, strategy, link, notes=[])  # its noise notes: advise's own
    model.noise_scale = None  # advise reads the noise scale itself (statistics)
    if readings.probes:
        model.work, fitted = fit_compute(readings.probes, model.work.other_s)
        model.inputs = [fitted if i.name == "compute(b)" else i for i in model.inputs]
    model.contention, inputs = contention.factors(readings.baselines, model.work, 1)
    figures += [figure(i) for i in model.inputs if not i.name.startswith("noise")]
    figures += [figure(i) for i in inputs]
    return model


def fit_compute(probes: list[RunRecord], other: float) -> tuple[Work, Input]:
    """compute(b) = fixed + per_sample·b by least squares over the probes, the intercept kept
    at 0 or above (through the origin when it would fall below): a small batch never computes
    faster than nothing."""
    by_batch: dict[int, list[float]] = {}
    for r in probes:
        p = calibrate.phases(r)
        by_batch.setdefault(p.batch, []).append(p.compute_s)
    points = sorted((b, median(ts)) for b, ts in by_batch.items())
    xs, ys = [float(b) for b, _ in points], [t for _, t in points]
    shown = ", ".join(f"b={b}: {t * 1e3:.3g} ms" for b, t in points)
    busy = [r for r in probes if r.get("machine", "busy") is True]
    if busy:
        cores = max((r.get("machine", "other_cores") or 0.0) for r in busy)
        shown += (f"; {len(busy)} on a busy machine, other programs using up to {cores:.2f} "
                  "cores")
    if len(points) >= 2:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / \
            sum((x - mx) ** 2 for x in xs)
        fixed = my - slope * mx
        if fixed < 0 or slope <= 0:
            slope, fixed = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs), 0.0
        return Work(slope, fixed, other), Input(
            "compute(b)", f"{fixed * 1e3:.4g} ms + {slope * 1e6:.4g} us x b", "", "fitted",
            f"least squares over {len(points)} probes at 1 worker ({shown}), intercept >= 0")
    b, t = points[0]
    return Work(t / b, 0.0, other), Input(
        "compute(b)", f"{t * 1e3:.4g} ms at b={b}", "", "measured",
        "one probe at 1 worker; other batches assumed proportional to b")


def work_band(readings: Readings, model: Model) -> float:
    """How far the work per step may be off: the compute line's largest miss at a probe, the
    share of the machine other programs took during any probe, and at least 5 %."""
    band = 0.05
    for r in readings.probes:
        p = calibrate.phases(r)
        fitted = model.work.compute(p.batch)
        if fitted > 0:
            band = max(band, abs(p.compute_s - fitted) / fitted)
        cores = r.get("machine", "cores") or 1
        other = (r.get("machine", "other_cores") or 0) + (r.get("machine", "steal_cores") or 0)
        if r.get("machine", "busy") is True:
            band = max(band, other / cores)
    return min(band, 0.9)


def link_of(readings: Readings, opts: Options) -> tuple[Link | None, Link | None, float, float,
                                                         str]:
    """(link, intra-node link, band low, band high, words): measured here, a comm record, or
    presets on a cluster."""
    if opts.cluster:
        between = preset(str(opts.interconnect))
        inside = fit_comm(_comm_record(opts.comm), f"--comm {opts.comm}") if opts.comm \
            else preset(opts.intra_node or "nvlink")
        return between, inside, 1 / PRESET_BAND, PRESET_BAND, "presets: assumed"
    record = readings.comm if readings.comm is not None else \
        (_comm_record(opts.comm) if opts.comm else None)
    if record is None:
        return None, None, 1.0, 1.0, ""
    link = fit_comm(record, "the link measured here")
    miss = max(LINK_BAND, float((link.fit or {}).get("max_relative_residual", LINK_BAND)))
    miss = min(miss, 0.9)
    return link, None, 1 - miss, 1 + miss, f"fitted, rows off by up to {miss:.0%}"


def _comm_record(path: str | None) -> Any:
    from pathlib import Path

    from parascale.record import COMM_NAME
    from parascale.safejson import Refused, load

    file = Path(str(path))
    file = file / COMM_NAME if file.is_dir() else file
    try:
        return load(file)
    except (Refused, OSError) as exc:
        raise UsageError(f"--comm {path}: cannot read a comm record there ({exc})") from None


def flops_speed(flops: float, how: str, source: str, opts: Options, precision: str,
                size: float, link: Link, intra: Link | None, figures: list[Figure]
                ) -> tuple[Model, dict[str, float]]:
    """A cluster device's step from FLOPs: per sample flops / (peak x utilisation)."""
    peaks = {p: _peak(opts, p) for p in {precision, *(opts.precisions or ())}}
    peak, peak_source = peaks[precision]
    mfu = opts.mfu or MFU
    per_sample = flops / (peak * mfu)
    figures += [
        Figure("FLOPs per sample", flops, "FLOP", how, source),
        Figure("device peak", peak / 1e12, "TFLOP/s", "given" if opts.peak_tflops else "counted",
               peak_source),
        Figure("utilisation (MFU)", mfu, "of the peak", "given" if opts.mfu else "assumed",
               "model-FLOPs utilisation of a device running this job; a record of one run on "
               "such a device would measure it", mfu * (1 - MFU_BAND), mfu * (1 + MFU_BAND)),
        Figure("compute(b)", f"{per_sample * 1e6:.4g} us x b", "", "assumed",
               "FLOPs per sample / (peak x utilisation); the optimizer's step taken as free"),
        Figure("wait for the slowest", 0.0, "s", "assumed", "the cluster's devices taken as "
               "equal; a record of runs on them would measure their spread"),
        Figure("overlap φ", calibrate.ASSUMED_OVERLAP, "of compute", "assumed",
               "backward's share of forward + backward, behind which DDP's exchange hides")]
    # predict's model types its optional links loosely (it is checked without Optional)
    model = Model(Work(per_sample, 0.0, 0.0), size, costs.strategy(sync.DEFAULT), link,
                  calibrate.ASSUMED_OVERLAP, calibrate.buckets_for(size), cast(Any, intra),
                  cast(Any, opts.gpus_per_node))
    scale = {p: peak / found for p, (found, _) in peaks.items()}
    return model, scale


def records_speed(opts: Options, link: Link, intra: Link | None, figures: list[Figure]
                  ) -> tuple[Model, RunRecord]:
    """A cluster device's step from records of the job run on one (``--records``):
    predict's calibration, the links the cluster's."""
    from parascale.report.load import load_records

    try:
        loaded = load_records(list(opts.records))
    except UsageError as exc:  # the loader speaks as 'report'; this is advise
        raise UsageError(str(exc).removeprefix("report: ")) from None
    records = calibrate.usable(loaded.records)
    if not records:
        raise UsageError(f"--records {' '.join(opts.records)}: no finished run record there "
                         "(status ok, not a baseline)")
    given = (opts.params * 4, f"--params {opts.params:.4g}, 4 bytes each (fp32 gradients)") \
        if opts.params else None
    model = calibrate.build(records, costs.strategy(sync.DEFAULT), link, intra=intra,
                            per_node=opts.gpus_per_node, given_bytes=given, notes=[])
    model.noise_scale = None  # advise reads the noise scale itself (statistics)
    figures += [figure(i) for i in model.inputs if not i.name.startswith("noise")]
    return model, records[0]


def _peak(opts: Options, precision: str) -> tuple[float, str]:
    if opts.peak_tflops is not None:
        return opts.peak_tflops * 1e12, f"--peak-tflops {opts.peak_tflops:g}"
    from parascale.flops import GPU_PEAKS, gpu_peak

    found = gpu_peak(str(opts.gpu), precision)
    if found is None:
        raise UsageError(f"--gpu {opts.gpu!r}: not a GPU parascale knows the peak of (known: "
                         f"{', '.join(name for name, *_ in GPU_PEAKS)}); give --peak-tflops T")
    return found[0], found[1]


# -- memory ----------------------------------------------------------------------------------

def counted_per_parameter(flat: dict[str, Any]) -> memory_model.PerParameter:
    """Bytes per parameter of fp32 training with the job's optimizer."""
    state = 8.0 if flat.get("optimizer") == "adamw" else (4.0 if flat.get("momentum") else 0.0)
    return memory_model.PerParameter(4, 4, state, f"counted: fp32 parameters and gradients, "
                                     f"{flat.get('optimizer')}'s state of {state:g} bytes")


def memory_of(pilot: RunRecord | None, opts: Options, flat: dict[str, Any],
              params: float | None, figures: list[Figure], budget: float | None) -> Memory:
    if pilot is not None and pilot.get("memory", "split_per_rank"):
        psi, per, activations, words = memory_model.from_record(pilot)
        batch = pilot.get("derived", "per_device_batch") or 1
        split = pilot.get("memory", "split_per_rank")[0]
        held = split["parameters_bytes"] + split["gradients_bytes"] + \
            split["optimizer_state_bytes"] + (split["activations_bytes"] or 0)
        peaks = pilot.get("memory", "peak_bytes_per_rank") or [held]
        overhead = max(0.0, float(peaks[0]) - held) if not opts.cluster else 0.0
        figures.append(Figure("memory", f"{psi:,.0f} parameters, {per.params:g} + {per.grads:g}"
                              f" + {per.state:g} bytes each, activations "
                              f"{activations / batch / 2**20:.4g} MiB per sample", "",
                              "measured", per.source))
        if overhead:
            figures.append(Figure("memory beyond the model", overhead / 2**20, "MiB",
                                  "measured", "the pilot's peak resident memory less what it "
                                  "held (the interpreter, torch)"))
        return Memory(psi, per, activations / batch, overhead, budget)
    if params is None:
        raise UsageError("the memory model needs the parameters: give --params N, or let "
                         "advise run the job here")
    per = counted_per_parameter(flat)
    acts = opts.activations_per_sample or 0.0
    figures.append(Figure("memory", f"{params:,.0f} parameters, {per.params:g} + "
                          f"{per.grads:g} + {per.state:g} bytes each", "", "counted",
                          per.source))
    figures.append(Figure("activations per sample", acts / 2**20, "MiB",
                          "given" if opts.activations_per_sample is not None else "assumed",
                          "--activations-per-sample" if opts.activations_per_sample is not None
                          else "not known: none counted (a run here measures them)"))
    return Memory(params, per, acts, 0.0, budget)


def memory_check(memory: Memory, probes: list[RunRecord]) -> Figure | None:
    """The memory model against one probe: the largest probe's peak beside what the model
    (the pilot's split and overhead) says a device holds at its batch."""
    measured = [(r.get("derived", "per_device_batch"), r.get("memory", "peak_bytes_per_rank"))
                for r in probes]
    measured = [(b, p[0]) for b, p in measured if isinstance(b, int) and p and p[0]]
    if not measured:
        return None
    batch, peak = max(measured)
    predicted = memory.per_device(0, 1, batch)
    return Figure("memory check", f"{predicted / 2**20:,.0f} MiB predicted, {peak / 2**20:,.0f} "
                  f"MiB measured at b={batch} ({predicted / peak - 1:+.0%})", "", "measured",
                  "the largest probe's peak resident memory against the model at its batch")


# -- statistics ------------------------------------------------------------------------------

def steps_to_target(record: RunRecord, metric: str, value: float, higher: bool
                    ) -> tuple[float, float, float, str]:
    """(steps, low, high, words): where the pilot's curve crossed the target, between the
    evaluation before it (low) and the one that reached it (high)."""
    tta = record.get("time_to_accuracy") or {}
    if not tta.get("reached"):
        best = _best(record, metric, higher)
        raise UsageError(f"the job did not reach {metric} {'>=' if higher else '<='} {value:g} "
                         f"within its budget (the pilot's {len(record.get('epochs', default=[]))}"
                         f" epoch(s) at the reference batch; best {best}): give more --epochs "
                         "or --steps, or a target it reaches")
    split = "val" if tta.get("split") == "validation" else "test"
    key = f"{split}_{metric}"
    done, before = 0, (0, None)
    for entry in record.get("epochs", default=[]):
        done += int(entry.get("steps") or 0)
        seen = entry.get(key)
        if seen is None:
            continue
        met = seen >= value if higher else seen <= value
        if met:
            s0, v0 = before
            if v0 is None or v0 == seen:
                return float(done), 1e-9 if s0 == 0 else float(s0), float(done), (
                    f"reached at the evaluation after step {done}; the evaluation before it "
                    f"was at step {s0}" if s0 else f"reached in the first evaluated epoch "
                    f"(step {done}): known only to lie within it")
            share = min(1.0, max(0.0, (value - v0) / (seen - v0)))
            central = s0 + share * (done - s0)
            return central, float(s0), float(done), (
                f"{key} crossed {value:g} between steps {s0} ({v0:.4g}) and {done} "
                f"({seen:.4g}): step {central:.0f} by linear interpolation")
        before = (done, seen)
    raise UsageError(f"{record.path}: time_to_accuracy says reached, but no epoch's {key} is")


def _best(record: RunRecord, metric: str, higher: bool) -> str:
    values = [e.get(f"test_{metric}", e.get(f"val_{metric}"))
              for e in record.get("epochs", default=[])]
    values = [v for v in values if isinstance(v, (int, float))]
    return f"{(max if higher else min)(values):.4g}" if values else "none evaluated"


def evaluation(record: RunRecord) -> tuple[float, float]:
    """(one evaluation's seconds, the first epoch's extra seconds) from the pilot's epochs."""
    epochs = [e for e in record.get("epochs", default=[]) if isinstance(e, dict)]
    evals, last = [], 0.0
    for e in epochs:
        elapsed, wall = e.get("elapsed_s"), e.get("wall_time_s")
        if isinstance(elapsed, (int, float)) and isinstance(wall, (int, float)):
            evals.append(max(0.0, elapsed - last - wall))
            last = elapsed
    step = record.get("steps", "phases", "step", "mean") or 0.0
    first = epochs[0] if epochs else {}
    extra = max(0.0, (first.get("wall_time_s") or 0.0) - (first.get("steps") or 0) * step)
    return (median(evals) if evals else 0.0), extra


def noise_of(pilot: RunRecord | None, opts: Options, figures: list[Figure]
             ) -> tuple[float | None, float | None, int | None, bool]:
    if opts.noise_scale is not None:
        se = opts.noise_scale_se
        figures.append(Figure("noise scale B_noise", opts.noise_scale, "samples", "given",
                              "--noise-scale" + (" with --noise-scale-se" if se else ""),
                              *((opts.noise_scale - se, opts.noise_scale + se) if se
                                else (None, None))))
        return opts.noise_scale, se, None, True
    noise = pilot.get("noise") if pilot is not None else None
    if not isinstance(noise, dict) or noise.get("noise_scale") is None:
        why = (noise or {}).get("reason") if isinstance(noise, dict) else None
        figures.append(Figure("noise scale B_noise", "not measured", "", "measured",
                              why or "no run measured it"))
        return None, None, None, False
    assert pilot is not None
    value, se, steps, words = pooled_noise(pilot)
    figures.append(Figure("noise scale B_noise", value, "samples", "measured",
                          f"the pilot's {words}: B_simple, jackknife standard error",
                          *((value - se, value + se) if se else (None, None))))
    return value, se, steps, False


def pooled_noise(record: RunRecord) -> tuple[float, float | None, int | None, str]:
    """The noise scale of the pilot's last epoch, pooled with the epochs before it until it
    is precise enough to advise from or none is left: one epoch of a short job rests on few
    steps. Pooled on a log scale, each epoch weighted by the inverse square of its relative
    standard error (the error grows with the figure, so weighting the figures themselves
    would lean towards the smallest). The noise scale grows as training goes, so pooling
    earlier epochs leans towards smaller batches; the figure says how many were pooled."""
    from parascale import precision

    epochs = [(i, e) for i, e in enumerate(record.get("epochs", default=[]), 1)
              if isinstance(e, dict) and isinstance(e.get("noise_scale"), (int, float))
              and e["noise_scale"] > 0]
    value, se, steps = 0.0, None, 0
    used: list[int] = []
    for i, _ in reversed(epochs):
        used.append(i)
        pairs = [(ep["noise_scale"], ep.get("noise_scale_se"), ep.get("noise_steps") or 0)
                 for j, ep in epochs if j in used]
        if all(isinstance(p[1], (int, float)) and p[1] > 0 for p in pairs):
            weights = [(p[0] / p[1]) ** 2 for p in pairs]
            value = math.exp(sum(w * math.log(p[0]) for w, p in zip(weights, pairs))
                             / sum(weights))
            se = value * sum(weights) ** -0.5
        else:
            value, se = pairs[0][0], pairs[0][1]
        steps = sum(int(p[2]) for p in pairs)
        if precision.judge(value, se, steps).precise:
            break
    words = f"epoch {used[0]}" if len(used) == 1 else \
        f"epochs {min(used)}-{max(used)} pooled (log scale, by relative error)"
    return float(value), (float(se) if se is not None else None), steps, \
        f"{words}, over {steps} steps"


def budget_samples(opts: Options, train: int | None, per_sample: float) -> float | None:
    if opts.budget is None:
        return None
    if opts.budget_unit == "tokens":
        return opts.budget / per_sample
    if opts.budget_unit == "epochs":
        if not train:
            raise UsageError("--budget-epochs needs the training set's size: give "
                             "--train-samples N")
        return opts.budget * train
    return opts.budget


def cap_samples(flat: dict[str, Any], batch: int, train: int | None) -> float | None:
    """The samples a run may take to reach the target: the job's steps or epochs."""
    if flat.get("steps"):
        return float(flat["steps"]) * batch
    if train:
        return float(flat.get("epochs") or 3) * train
    return None


def statistics(flat: dict[str, Any], opts: Options, pilot: RunRecord | None,
               figures: list[Figure], units_per_sample: float, higher: bool,
               probes: list[RunRecord] | None = None) -> Statistics:
    batch, lr = reference(flat)
    if pilot is not None:
        batch = int(pilot.get("derived", "global_batch") or batch)
    noise, se, steps_noise, given = noise_of(pilot, opts, figures)
    train = opts.train_samples or (pilot.get("derived", "train_samples") if pilot else None)
    stats = Statistics(batch, lr, str(flat.get("optimizer") or "sgd"), noise, se, steps_noise,
                       given, train_samples=train, eval_every=int(flat.get("eval_every") or 1),
                       warmup_given=bool(flat.get("warmup_steps") or flat.get("warmup_epochs")))
    stats.budget_samples = budget_samples(opts, train, units_per_sample)
    stats.cap_samples = cap_samples(flat, batch, train)
    if pilot is not None:
        stats.eval_s, extra = evaluation(pilot)
        stats.eval_devices = pilot.workers or 1
        figures.append(Figure("one evaluation", stats.eval_s, "s", "measured",
                              f"the pilot's epochs on {stats.eval_devices} workers (spread over "
                              "N devices: assumed)"))
        probed = [(r.workers, *evaluation(r)) for r in probes or ()]
        # the pilot runs first, on a cold machine (its first epoch took 0.1 s more than its
        # steps where every later run's took 5-20 ms): the first epoch's extra is the median
        # over every run advise made here
        stats.first_epoch_s = median([extra, *(e for _, _, e in probed)])
        alone = [seconds for workers, seconds, _ in probed if workers == 1]
        if alone and stats.eval_devices != 1:
            stats.eval_alone_s = median(alone)
            figures.append(Figure("one evaluation on 1 device", stats.eval_alone_s, "s",
                                  "measured", f"the last evaluation of {len(alone)} probe(s) at "
                                  "1 worker, median"))
    if stats.budget_samples is not None:
        figures.append(Figure("budget", stats.budget_samples, "samples", "given",
                              f"--budget-{opts.budget_unit} {opts.budget:g} at the reference "
                              f"batch {batch}"))
        return stats
    metric, value = _target(flat)
    if opts.steps_to_target is not None:
        stats.steps = opts.steps_to_target
        figures.append(Figure("steps to the target", stats.steps, "steps", "given",
                              f"--steps-to-target at global batch {batch}"))
        if stats.cap_samples is not None and stats.steps * batch > stats.cap_samples:
            raise UsageError(f"--steps-to-target {stats.steps:g} at global batch {batch} is "
                             f"{stats.steps * batch:,.0f} samples, beyond the job's budget of "
                             f"{stats.cap_samples:,.0f} (its --epochs or --steps): the job "
                             "cannot reach its target within it")
        return stats
    if pilot is None:
        raise UsageError("the steps to the target are needed: give --steps-to-target S (at "
                         "the job's batch), or let advise run the job here")
    stats.steps, stats.steps_low, stats.steps_high, words = steps_to_target(
        pilot, metric, value, higher)
    figures.append(Figure("steps to the target", stats.steps, "steps", "measured",
                          f"the pilot at global batch {batch}: {words}", stats.steps_low,
                          stats.steps_high))
    return stats


def _target(flat: dict[str, Any]) -> tuple[str, float]:
    if flat.get("target_metric") is not None:
        return str(flat["target_metric"]), float(flat["target_value"])
    return "accuracy", float(flat["target_accuracy"])


def to_basis(subject: str, speed: Speed, stats: Statistics, figures: list[Figure],
             notes: list[str], readings: Readings, units: tuple[str, float]) -> Basis:
    basis = Basis(subject, speed, stats, figures, notes, list(readings.lines))
    basis.unit, basis.units_per_sample = units
    if not math.isfinite(speed.model.work.per_sample_s):
        raise UsageError("the work per sample came out infinite; check the given figures")
    return basis
