"""Memory per device under each data-parallel strategy, and how many devices a model needs.

Rajbhandari et al. 2020 ("ZeRO", section 3/5): a model of Ψ parameters trained with Adam in
mixed precision holds 2Ψ bytes of fp16 parameters, 2Ψ of fp16 gradients and KΨ = 12Ψ of
optimizer state (an fp32 copy of the parameters, momentum and variance): 16Ψ per device when
replicated; stage 1 shards the state (4Ψ + 12Ψ/N), stage 2 the gradients too (2Ψ + 14Ψ/N),
stage 3 the parameters as well (16Ψ/N). Activations (measured by a run at its per-device batch)
come on top, whole on every device. Communication per device and step: 2(N−1)/N of the
gradients for replicated, stage 1 and stage 2 (allreduce, or reduce-scatter plus all-gather),
3(N−1)/N at stage 3 (the parameters are gathered again in backward).

Beyond the paper's steady state, FSDP as parascale runs it (sync/fsdp.py) peaks higher, which
:func:`peak` adds where the largest unit (a transformer block, a layer) is known: backward
builds one unit's gradients whole before reduce-scattering them, into a buffer of the same size
(2·G per parameter of the unit); at stage 3 the unit computing and the next one, prefetched, are
gathered whole (2·P per parameter of the unit). Evaluation gathers one unit at a time as the
step does, its gradients freed, so it never peaks above the step. Before training, a rank holds
the model as it is built (:func:`startup`): whole, PΨ, under a strategy that keeps the
parameters whole; under one that shards them, its shards, filled one tensor at a time with the
largest tensor whole beside them (PΨ/N + P·largest; training/loop/building.py, models/deferred.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from parascale import sync
from parascale.errors import UsageError
from parascale.predict import limits


@dataclass(frozen=True)
class PerParameter:
    """Bytes per parameter: parameters, gradients, optimizer state; and where they come from."""

    params: float
    grads: float
    state: float
    source: str


MIXED_ADAM = PerParameter(2, 2, 12, "mixed-precision Adam as in the ZeRO paper (assumed)")

#: each stage's label, and which of params/grads/state it splits N ways (the paper's stages)
STAGES = (("replicated", ()), ("stage 1", ("state",)), ("stage 2", ("grads", "state")),
          ("stage 3", ("params", "grads", "state")))


def runs(stage: int) -> str:
    """The --sync that runs ``stage`` (``fsdp --sync-option stage=2``), as the strategies
    declare their stages (``Strategy.stages``)."""
    return sync.sharding_stages().get(stage, "(no strategy runs it)")


def per_device(stage: int, psi: float, n: int, b: PerParameter, activations: float = 0.0
               ) -> float:
    """Bytes one of ``n`` devices holds at ``STAGES[stage]``."""
    split = STAGES[stage][1]
    held = sum(getattr(b, k) / (n if k in split else 1) for k in ("params", "grads", "state"))
    return held * psi + activations


def transient(stage: int, b: PerParameter, unit: float) -> float:
    """Bytes a step of ``stage`` holds beyond its steady state, for a largest unit of ``unit``
    parameters (see the module's docstring)."""
    if stage < 2:
        return 0.0
    return 2 * b.grads * unit + (2 * b.params * unit if stage == 3 else 0.0)


def shards_parameters(stage: int) -> bool:
    """Whether the strategy that runs ``stage`` keeps only a part of the parameters on each
    rank between steps, and so builds the model shard by shard (its traits say)."""
    name = runs(stage).split()[0]
    return "params" in sync.traits_of(name).shards if name in sync.names() else False


def startup(stage: int, psi: float, n: int, b: PerParameter, largest: float = 0.0) -> float:
    """Bytes a rank holds as the model is built: PΨ whole, or, where ``stage``'s strategy
    shards the parameters on ``n`` > 1 ranks, the shards, each tensor replayed whole on its
    own (``largest`` parameters, the largest tensor) before its shard is kept."""
    if n > 1 and shards_parameters(stage):
        return b.params * (psi / n + largest)
    return b.params * psi


def peak(stage: int, psi: float, n: int, b: PerParameter, activations: float = 0.0,
         unit: float = 0.0, largest: float = 0.0) -> float:
    """The peak of one of ``n`` devices as parascale trains: the steady bytes plus the step's
    transients, or the start-up's, whichever is more (on one device nothing is sharded or
    gathered)."""
    steady = per_device(stage, psi, n, b, activations)
    if stage >= 2 and n > 1:
        steady += transient(stage, b, unit)
    return max(steady, startup(stage, psi, n, b, largest))


def largest_unit(record) -> int | None:
    """The parameters of the largest unit FSDP would shard ``record``'s model by (its blocks or
    layers, tied ones together: sync/fsdp.py), counted on the model built without weights;
    None if it cannot be."""
    sizes = _sizes(record)
    return None if sizes is None else sizes[0]


def largest_tensor(record) -> int | None:
    """The parameters of ``record``'s model's largest parameter tensor, or None."""
    sizes = _sizes(record)
    return None if sizes is None else sizes[1]


def _sizes(record) -> tuple[int, int] | None:
    from parascale.predict.gradient import build
    from parascale.sync.fsdp import groups

    model = build(record)
    if model is None:
        return None
    sizes = [sum(p.numel() for m in g for p in m.parameters()) for g in groups(model)]
    # the model itself is the last unit, holding what no other does (embeddings, a head)
    unit = max([*sizes, sum(p.numel() for p in model.parameters()) - sum(sizes)])
    return unit, max(p.numel() for p in model.parameters())


def sent_per_step(stage: int, psi: float, n: int, b: PerParameter) -> float:
    """Bytes a device sends per step (the gradients' size sets it; stage 3 adds a gather)."""
    return (3 if stage == 3 else 2) * (n - 1) / n * b.grads * psi


def devices_needed(stage: int, psi: float, memory: float, b: PerParameter,
                   activations: float = 0.0) -> int | None:
    """The fewest devices of ``memory`` bytes that hold the model at this stage, or None."""
    split = STAGES[stage][1]
    whole = sum(getattr(b, k) for k in ("params", "grads", "state") if k not in split) * psi
    parts = sum(getattr(b, k) for k in split) * psi
    room = memory - whole - activations
    if room <= 0:
        return None
    return max(1, math.ceil(parts / room)) if parts else 1


def from_record(record) -> tuple[float, PerParameter, float, str]:
    """(Ψ, bytes per parameter, activations, words) from a record's ``memory.split_per_rank``."""
    split = record.get("memory", "split_per_rank")
    if not split or not all(split):
        raise UsageError(f"{record.path}: the record holds no memory split (written by a "
                         "parascale before it, or under --compile); give --params N instead")
    name = record.sync
    sharded = sync.traits_of(name).shards if len(split) > 1 else frozenset()
    psi = float(split[0]["parameter_count"])
    keys = {"params": "parameters_bytes", "grads": "gradients_bytes",
            "state": "optimizer_state_bytes"}
    whole = {k: sum(s[v] for s in split) if k in sharded else split[0][v]
             for k, v in keys.items()}
    b = PerParameter(whole["params"] / psi, whole["grads"] / psi, whole["state"] / psi,
                     f"measured by {record.path} (--sync {name}, {len(split)} worker(s))")
    activations = float(max(s["activations_bytes"] or 0 for s in split))
    batch = record.get("derived", "per_device_batch")
    return psi, b, activations, (f"activations {activations / 2**20:,.1f} MiB per device "
                                 f"at per-device batch {batch}, measured")


def table(psi: float, memory_gib: float, b: PerParameter, activations: float,
          act_words: str, workers: list[int], unit: int | None = None,
          largest: int | None = None) -> str:
    """The answer and the per-device figures, as printed by ``parascale predict``."""
    memory = memory_gib * 2**30
    lines = [f"memory: {psi:,.0f} parameters; {b.params:g} + {b.grads:g} + {b.state:g} bytes "
             f"per parameter (parameters + gradients + optimizer state), {b.source}",
             f"  {act_words}", f"devices of {memory_gib:g} GiB needed:"]
    for stage, (label, _) in enumerate(STAGES):
        n = devices_needed(stage, psi, memory, b, activations)
        lines.append(f"  {label:<10} (--sync {runs(stage)}): "
                     + (f"{n:,}" if n is not None else
                        "never: what every device holds whole does not fit"))
    lines.append("GiB per device (and GiB each sends per step) for N devices:")
    lines.append("  " + f"{'N':>6}" + "".join(f"{label:>22}" for label, _ in STAGES))
    for n in workers:
        cells = "".join(f"{per_device(s, psi, n, b, activations) / 2**30:>12.2f} "
                        f"({sent_per_step(s, psi, n, b) / 2**30:>6.2f})"
                        for s in range(len(STAGES)))
        lines.append(f"  {n:>6}{cells}")
    if unit is not None:
        lines.append(f"GiB per device at the peak as parascale runs {runs(3).split()[0]} "
                     f"(largest unit {unit:,} "
                     "parameters: its gradients whole and the reduce-scatter's buffer, at stage "
                     "3 it and the next unit gathered, in evaluation too; the model built shard "
                     f"by shard, its largest tensor ({largest or 0:,} parameters) whole at a "
                     "time):")
        lines.append("  " + f"{'N':>6}" + "".join(f"{STAGES[s][0]:>12}" for s in (2, 3)))
        for n in workers:
            lines.append(f"  {n:>6}" + "".join(
                f"{peak(s, psi, n, b, activations, unit, largest or 0) / 2**30:>12.2f}"
                for s in (2, 3)))
    lines.append("  not modelled: DDP's gradient buckets (+ the gradients again under replicated "
                 "and stage 1), " + ("" if unit is not None else
                                     "FSDP's transients (a record of a model built here gives "
                                     "them), ") + "temporaries, and the framework itself")
    return "\n".join(lines)


def answer(sources: list[str], params: float | None, memory_gib: float, workers: list[int],
           model: str | None = None) -> str:
    """``parascale predict --device-memory``: from ``--params``, a record, or both (Ψ given,
    the bytes per parameter and the activations measured)."""
    # the scaling prediction's limits (forecast.validate), so that every count stays short
    limits.option("device-memory", memory_gib, limits.MIN_GIB, limits.MAX_GIB,
                  "a positive number of GiB")
    limits.workers(workers)
    limits.option("params", params, 1, limits.MAX_BYTES / 4, "a parameter count")
    if not sources:
        if params is None:
            raise UsageError("--device-memory needs the model: --params N (e.g. 7e9), or a "
                             "record of a run with its memory split")
        return table(params, memory_gib, MIXED_ADAM, 0.0,
                     "activations: not counted (a record of a run measures them)", workers)
    from parascale.report.load import load_records

    try:
        loaded = load_records(sources)
    except UsageError as exc:
        raise UsageError(str(exc).removeprefix("report: ")) from None
    usable = [r for r in loaded.ok if r.get("memory", "split_per_rank")
              and (model is None or r.model == model)]
    if not usable:
        raise UsageError(f"no finished record with a memory split in {', '.join(sources)}"
                         + (f" for --model {model}" if model else "")
                         + "; train with this parascale, or give --params N alone")
    psi, b, activations, words = from_record(usable[0])
    unit, largest = largest_unit(usable[0]), largest_tensor(usable[0])
    if params is not None:  # the record's units are not --params' model's
        psi, words, unit = params, words + " (for the record's model, not --params')", None
    return table(psi, memory_gib, b, activations, words, workers, unit, largest)
