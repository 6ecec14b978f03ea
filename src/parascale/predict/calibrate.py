"""From run records to a :class:`~parascale.predict.model.Model`, saying how each figure is known.

- Work per step: the reference records are the ok, non-baseline records at the smallest worker
  count present (one worker when there is one: on more, overlapped communication and processes
  sharing a machine slow compute, which the model would then count twice). Per record, from its
  steady per-step phase means (every rank, warm-up excluded): compute = data + compute phases
  (the per-sample work), other = step − compute − sync (the optimizer step and the rest).
  Means, not medians: a step is a sum of its phases, and means add up, medians do not.
- compute(b): with records at two or more per-device batches, a least-squares line
  ``fixed + per_sample·b`` (fitted); with one batch, proportional to b through it (assumed
  linear: small batches underuse a device, so strong scaling's shrinking batches are
  predicted a little optimistically).
- Spread σ of a step: (p95 − p50) / 1.645 of the reference records' steady step times (the
  normal distribution's ratio; a step at one worker has no exchange, so this is the work's
  own variation), the median over the records. It sets the wait for the slowest device.
- Overlap φ (strategies that overlap, DDP): measured where a record of the same strategy on 2+
  workers exists *and* the link was fitted to a comm record of the same machine (the record's
  exposed sync against the modelled exchange on that link); otherwise assumed: on GPUs 2/3,
  backward's usual share of forward + backward (backward costs about twice the forward); on
  CPUs 0, since gloo's threads run the exchange on the very cores that compute, so overlapped
  communication slows backward instead of hiding (docs/strategies.md). Or given by hand.
- Exchange scale: where φ was measured as 0 and a record's step at N > 1 is still longer than
  the modelled work, exchange and wait, what it took beyond the modelled work over the
  modelled exchange (:func:`exchange`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from parascale import precision
from parascale.errors import UsageError
from parascale.predict import costs, gradient, limits, wait
from parascale.predict.interconnect import Link
from parascale.predict.model import Input, Model, Work, overlap_from
from parascale.report.load import RunRecord

ASSUMED_OVERLAP = 2 / 3
DDP_FIRST_BUCKET = 1 << 20  # DDP's first bucket is 1 MiB whatever --bucket-mb says


@dataclass(frozen=True)
class Phases:
    """A record's steady per-step figures (seconds, means over every rank's steady steps)."""

    record: RunRecord
    batch: int
    compute_s: float  # data + forward + backward
    sync_s: float
    other_s: float  # optimizer and the rest of the step
    spread_s: float  # σ of the step time, from its p50 and p95
    shape: tuple[float, ...] = ()  # the per-step work's quantiles less their mean (newer records)
    samples: int = 0  # the steps behind them


def phases(record: RunRecord) -> Phases:
    """The steady phase means of a record, or one line saying what is missing."""
    got = {name: record.get("steps", "phases", name, "mean")
           for name in ("step", "data", "compute", "sync", "optimizer")}
    missing = [name for name in ("step", "compute") if got[name] is None]
    batch = record.get("derived", "per_device_batch")
    if missing or batch is None:
        what = ", ".join(f"steps.phases.{m}.mean" for m in missing) or "derived.per_device_batch"
        raise UsageError(f"{record.path}: the record has no steady step times ({what} missing); "
                         "predict needs a finished run of this parascale (status ok, at least "
                         "one steady step)")
    # present but negative, infinite or absurd: refused by name, never computed with
    if not isinstance(batch, int) or isinstance(batch, bool):
        batch = None
    limits.field(record.path, "derived.per_device_batch", batch, 1, limits.MAX_COUNT, "samples")
    seconds = {name: limits.field(record.path, f"steps.phases.{name}.mean", value, 0,
                                  limits.MAX_SECONDS, "seconds")
               for name, value in got.items() if value is not None}
    if not seconds["step"] > 0:
        limits.field(record.path, "steps.phases.step.mean", got["step"], 1e-9,
                     limits.MAX_SECONDS, "seconds")
    data, sync = seconds.get("data", 0.0), seconds.get("sync", 0.0)
    compute = seconds["compute"] + data
    other = max(0.0, seconds["step"] - compute - sync)
    p50, p95 = (record.get("steps", "phases", "step", q) for q in ("p50", "p95"))
    spread = 0.0
    if p50 is not None and p95 is not None:
        p50, p95 = (limits.field(record.path, f"steps.phases.step.{q}", v, 0, limits.MAX_SECONDS,
                                 "seconds") for q, v in (("p50", p50), ("p95", p95)))
        spread = max(0.0, (p95 - p50) / 1.645)
    shape, samples = work_shape(record)
    return Phases(record, int(batch), compute, sync, other, spread, shape, samples)


def work_shape(record: RunRecord) -> tuple[tuple[float, ...], int]:
    """The record's per-step work quantiles (``steps.work.quantiles``) less their mean, and the
    steps behind them; ((), 0) for a record made before parascale kept them."""
    quantiles = record.get("steps", "work", "quantiles")
    if not isinstance(quantiles, list) or len(quantiles) < 2:
        return (), 0
    values = [limits.field(record.path, f"steps.work.quantiles[{i}]", q, 0, limits.MAX_SECONDS,
                           "seconds") for i, q in enumerate(quantiles)]
    if values != sorted(values):
        raise UsageError(f"{record.path}: steps.work.quantiles do not ascend; predict needs the "
                         "quantiles of the per-step work, lowest first")
    count = record.get("steps", "count")
    samples = int(limits.field(record.path, "steps.count", count, 1, limits.MAX_COUNT ** 2,
                               "steps")) if count is not None else 0
    return tuple(wait.centred(values)), samples


def usable(records: list[RunRecord]) -> list[RunRecord]:
    return [r for r in records if r.status == "ok" and not r.baseline and r.workers]


def reference(records: list[RunRecord]) -> list[Phases]:
    """The phases of the records at the smallest worker count."""
    smallest = min(r.workers for r in records)
    return [phases(r) for r in records if r.workers == smallest]


def fit_work(refs: list[Phases]) -> tuple[Work, Input]:
    """compute(b) from the reference records: a line over 2+ batches, else proportional."""
    by_batch: dict[int, list[Phases]] = {}
    for p in refs:
        by_batch.setdefault(p.batch, []).append(p)
    points = sorted((b, median(p.compute_s for p in ps)) for b, ps in by_batch.items())
    other = median(p.other_s for p in refs)
    n = refs[0].record.workers
    where = f"{len(refs)} record(s) at {n} worker(s)"
    if len(points) >= 2:
        xs, ys = [b for b, _ in points], [t for _, t in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / \
            sum((x - mx) ** 2 for x in xs)
        fixed = my - slope * mx
        if slope > 0 and fixed >= 0:
            text = ", ".join(f"b={b}: {t * 1e3:.3g} ms" for b, t in points)
            return Work(slope, fixed, other), Input(
                "compute(b)", f"{fixed * 1e3:.4g} ms + {slope * 1e6:.4g} us x b", "", "fitted",
                f"least squares over {len(points)} per-device batches ({text}); {where}")
    b, t = points[-1]
    return Work(t / b, 0.0, other), Input(
        "compute(b)", f"{t * 1e3:.4g} ms at b={b}", "", "measured",
        f"data + forward + backward, mean of steady steps, {where}; other batches: assumed "
        "proportional to b")


def gradient_size(records: list[RunRecord], given: tuple[float, str] | None) -> Input:
    if given is not None:
        return Input("gradient S", given[0], "bytes", "given", given[1])
    for record in sorted(records, key=lambda r: -(r.workers or 0)):
        found = gradient.from_record(record)
        if found:
            return Input("gradient S", found[0], "bytes", "measured", found[1])
    for record in records:
        found = gradient.counted(record)
        if found:
            return Input("gradient S", found[0], "bytes", "counted", found[1])
    raise UsageError(f"the records do not say how many bytes a step exchanges (model "
                     f"{records[0].model!r} on {records[0].dataset!r} cannot be counted here, and "
                     "no record has 2+ workers of a strategy that counts its bytes); "
                     "give --params N (e.g. 25.6M) or --gradient-bytes S")


def bucket_count(records: list[RunRecord], size: float) -> int:
    """DDP's buckets for S bytes with the records' --bucket-mb (default 25)."""
    mb = records[0].get("derived", "sync_options", "bucket_mb")
    if mb is None:
        return buckets_for(size)
    # DDP cuts S into buckets of this size: a tiny one would mean billions of messages
    return buckets_for(size, limits.field(records[0].path, "derived.sync_options.bucket_mb", mb,
                                          1e-3, 1e6, "MiB"))


def buckets_for(size: float, bucket_mb: float = 25.0) -> int:
    """DDP's buckets for S bytes: the 1 MiB first one, then ``bucket_mb`` MiB each."""
    if size <= DDP_FIRST_BUCKET:
        return 1
    return 1 + math.ceil((size - DDP_FIRST_BUCKET) / (bucket_mb * (1 << 20)))


def exchanging(records: list[RunRecord], model: Model) -> list[Phases]:
    """The phases of the records of the model's strategy on 2+ workers: the ones that show
    how its exchange went (φ, the exchange scale)."""
    return [phases(r) for r in records if r.sync == model.strategy.name and r.workers > 1]


def overlap(records: list[RunRecord], model: Model, given: float | None) -> Input:
    """φ: given, measured (same strategy on 2+ workers, link fitted to this machine), or assumed."""
    if not model.strategy.overlaps:
        return Input("overlap φ", 0.0, "", "assumed",
                     f"{model.strategy.name} exchanges after backward: nothing hides")
    if given is not None:
        return Input("overlap φ", given, "of compute", "given", "--overlap")
    # an exchange inside forward and backward (FSDP's) is counted as compute by its records:
    # no exposed sync to measure φ from
    if model.link.how == "measured" and not model.strategy.in_compute:
        measured = exchanging(records, model)
        if measured:
            picks = []
            for p in measured:
                expected = model.comm(p.record.workers) * model.strategy.hideable + \
                    model.wait(p.record.workers)
                picks.append((overlap_from(p.sync_s, expected, p.compute_s), p))
            phi = median(x for x, _ in picks)
            ns = sorted({p.record.workers for _, p in picks})
            sync_ms = ", ".join(f"{p.sync_s * 1e3:.3g}" for _, p in picks)
            return Input("overlap φ", phi, "of compute", "measured",
                         f"exposed sync {sync_ms} ms vs the modelled exchange and wait "
                         f"{model.comm(ns[0]) * 1e3:.3g} + {model.wait(ns[0]) * 1e3:.3g} ms at "
                         f"N={ns[0]} on the fitted link, {len(picks)} record(s) at "
                         f"N={','.join(map(str, ns))}")
    devices = {str(r.get("environment", "device_type", default="cuda")) for r in records}
    if devices == {"cpu"}:
        return Input("overlap φ", 0.0, "of compute", "assumed",
                     "the records ran on CPUs, where gloo's threads exchange on the cores that "
                     "compute: overlapped communication slows backward rather than hiding")
    return Input("overlap φ", ASSUMED_OVERLAP, "of compute", "assumed",
                 "backward's share of forward + backward (backward ~2x forward); DDP overlaps "
                 "bucket allreduces with it")


def exchange(records: list[RunRecord], model: Model, phi: Input) -> Input | None:
    """Where φ was measured as 0 (nothing hid) and the records' steps at N > 1 still take
    longer than the modelled work, exchange and wait, the step's exchange costs more than the
    link's line: the work around each collective (DDP's bucket copies and its hooks inside
    backward, gloo's threads taking cores from compute and the optimizer) and the step's other
    collectives (the noise scale's norms), none of which a comm record's bare allreduce holds.
    Sets ``model.exchange_scale`` to the median of (step − modelled work − wait) / modelled
    exchange over those records, carried to every N and strategy; None (scale 1) otherwise: a
    shortfall that φ explains, or nothing measured to scale by."""
    if phi.how != "measured" or phi.value > 0:
        return None
    picks = []
    for p in exchanging(records, model):
        n = p.record.workers
        modelled = model.comm(n)
        beyond = p.compute_s + p.sync_s + p.other_s - model.work_s(n, p.batch) - model.wait(n)
        if modelled > 0:
            picks.append(beyond / modelled)
    scale = median(picks) if picks else 1.0
    if scale <= 1.0:
        return None
    model.exchange_scale = scale
    return Input("exchange scale", scale, "x", "measured",
                 f"step less the modelled work and wait, over the modelled exchange, median of "
                 f"{len(picks)} record(s) at N > 1 that hid none of it: the work around the "
                 "step's collectives (on the cores that compute), and its other collectives, "
                 "beyond a bare allreduce's time; carried to every N and strategy")


def noise_scale(records: list[RunRecord], given: float | None,
                notes: list[str] | None = None) -> Input | None:
    """B_noise: given by hand (assumed), or the last measured epoch's ``noise_scale`` where
    training records it (median over the records). An estimate too imprecise to advise from
    (:mod:`parascale.precision`) is left out, with a note in ``notes`` saying why and how many
    steps would do."""
    if given is not None:
        return Input("noise scale B_noise", given, "samples", "assumed", "--noise-scale, by hand")
    found, unjudged, said = [], 0, []
    for record in records:
        epochs = [(i, e) for i, e in enumerate(record.get("epochs", default=[]))
                  if isinstance(e, dict) and e.get("noise_scale") is not None]
        if not epochs:
            continue
        i, last = epochs[-1]
        value = limits.field(record.path, f"epochs[{i}].noise_scale", last["noise_scale"],
                             1e-12, limits.MAX_SAMPLES, "samples")
        verdict = precision.judge(value, last.get("noise_scale_se"), last.get("noise_steps"))
        if verdict.precise or not verdict.known:
            found.append(value)
            unjudged += not verdict.known
        else:
            said.append(f"{record.path}: " + verdict.reason(
                f"its gradient noise scale ({value:,.4g} samples)"))
    if notes is not None:
        notes += [f"{line}; it is left out of the steps and time-to-accuracy columns"
                  for line in said]
        if unjudged:
            notes.append(f"{unjudged} record(s) give no standard error or step count for their "
                         "noise scale: its precision is unknown")
    if not found:
        return None
    return Input("noise scale B_noise", median(found), "samples", "measured",
                 f"the last measured epoch's noise_scale of {len(found)} record(s)")


def build(records: list[RunRecord], strategy: costs.Strategy, link: Link, *,
          intra: Link | None = None, per_node: int | None = None,
          given_bytes: tuple[float, str] | None = None, given_overlap: float | None = None,
          given_noise: float | None = None, strategy_given: bool = False,
          notes: list[str] | None = None) -> Model:
    """The calibrated model of ``records`` (finished runs that trained: :func:`usable`), with
    the list of its inputs and how each is known; what the reader should know about the inputs
    is added to ``notes``."""
    refs = reference(records)
    work, work_input = fit_work(refs)
    size = gradient_size(records, given_bytes)
    buckets = bucket_count(records, size.value) if strategy.overlaps else 1
    spread = median(p.spread_s for p in refs)
    shape, samples = reference_shape(refs)
    model = Model(work, size.value, strategy, link, 0.0, buckets, intra, per_node,
                  spread_s=spread, work_shape=shape, work_samples=samples)
    phi = overlap(records, model, given_overlap)
    model.overlap = phi.value
    scaled = exchange(records, model, phi)
    other = Input("other(b)", f"{work.other_s * 1e3:.4g} ms", "", "measured",
                  "optimizer step and the rest of the step, mean; taken as independent of b")
    links = [Input("link" if intra is None else "inter-node link", link.figures(), "",
                   link.how, link.source)]
    if intra is not None:
        links.append(Input("intra-node link", intra.figures(), "", intra.how,
                           f"{per_node} devices per node; {intra.source}"))
    if model.correction != 1.0:
        links.append(Input("size correction", model.correction, "x", "measured",
                           f"measured / fitted allreduce time at {size.value / buckets:.4g} "
                           f"bytes on {link.fit['world_size']} workers (the line's miss at this "
                           "size, carried to every N)"))
    model.inputs = [work_input, other, size,
                    Input("strategy", strategy.describe(), "",
                          "given" if strategy_given else "measured",
                          ("--sync; " if strategy_given else "what the records ran; ")
                          + "the records ran " + ", ".join(sorted({r.sync for r in records}))),
                    Input("messages per exchange", buckets, "", "counted",
                          "DDP's buckets: 1 MiB first, then the record's bucket_mb" if
                          strategy.overlaps else "one exchange"),
                    *links, phi, *([scaled] if scaled else []),
                    spread_input(model, spread, refs)]
    noise = noise_scale(records, given_noise, notes)
    if noise is not None:
        model.noise_scale = noise.value
        model.inputs.append(noise)
    return model



def reference_shape(refs: list[Phases]) -> tuple[tuple[float, ...], int]:
    """The reference records' work shape, quantile by quantile the median; () when one of them
    has none (an older record): then the wait falls back to σ, for all alike."""
    shapes = [p.shape for p in refs]
    if not shapes or any(len(s) != len(shapes[0]) or not s for s in shapes):
        return (), 0
    return tuple(median(column) for column in zip(*shapes)), min(p.samples for p in refs)


def spread_input(model: Model, spread: float, refs: list[Phases]) -> Input:
    """How the wait for the slowest device is known: measured quantiles, or σ from p50/p95."""
    n = refs[0].record.workers
    if model.work_shape:
        return Input("wait for the slowest", f"{model.wait(2) * 1e3:.3g} ms at N=2, "
                     f"{model.wait(8) * 1e3:.3g} ms at N=8", "", "measured",
                     f"E[max of N] - mean of the per-step work's {len(model.work_shape)} "
                     f"quantiles (steps.work) over {model.work_samples} steps at {n} worker(s), "
                     "devices taken as independent; beyond that many devices, grown as a "
                     "normal's")
    return Input("step spread σ", f"{spread * 1e3:.3g} ms", "", "measured",
                 f"(p95 - p50) / 1.645 of the steady step times at {n} worker(s); the wait for "
                 "the slowest of N devices, σ·g(N), assumes them normal and independent "
                 "(records older than steps.work)")
