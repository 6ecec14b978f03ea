"""``parascale advise``'s steps: check the question, measure what is missing here (or read it
from records, or take it as given), search the space, predict every configuration, rank them.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from parascale.advise import measure, readings, space
from parascale.advise.forecast import Basis, forecast
from parascale.advise.model import Speed
from parascale.advise.options import Options, validate
from parascale.advise.rank import Advice, decide
from parascale.errors import UsageError


def default_out(flat: dict[str, Any]) -> Path:
    name = str(flat.get("task") or f"{flat.get('model')}-{flat.get('dataset')}")
    return Path("advice") / "".join(c if c.isalnum() or c in ".+-" else "_" for c in name)


def _goal_words(flat: dict[str, Any], opts: Options, higher: bool | None) -> str:
    if opts.budget is not None:
        return f"a budget of {opts.budget:g} {opts.budget_unit} at the job's batch"
    metric = flat.get("target_metric") or "accuracy"
    value = flat.get("target_value") if flat.get("target_metric") else \
        flat.get("target_accuracy")
    cap = f"{flat['steps']} steps" if flat.get("steps") else \
        f"{flat.get('epochs') or 3} epochs"
    split = "test" if flat.get("evaluate_test", True) else "validation"
    return (f"{split} {metric} {'>=' if higher else '<='} {value:g} within the job's {cap} "
            "(its budget)")


def _higher(cfg: Any, flat: dict[str, Any], opts: Options) -> bool | None:
    if opts.budget is not None:
        return None
    from parascale import tasks

    directions = tasks.directions(cfg)
    tasks.check_target(cfg, directions)
    return directions["accuracy" if flat.get("target_metric") is None
                      else flat["target_metric"]]


def _measuring_plan(opts: Options, flat: dict[str, Any], sizes: list[int], workers: int,
                    target: bool) -> measure.Plan:
    """Here: always the pilot (statistics, memory, evaluation), probes and baselines. For a
    cluster: the pilot unless the statistics are given, one probe (FLOPs and memory) unless
    the parameters and the FLOPs are."""
    from parascale.runtime.env import cores_per_worker

    batch, _ = readings.reference(flat)
    per_device = int(flat.get("batch_size") or batch)
    here = not opts.cluster
    statistics_given = opts.noise_scale is not None and (not target or
                                                         opts.steps_to_target is not None)
    speed_given = bool(opts.records) or (opts.params is not None
                                         and opts.flops_per_sample is not None)
    pilot = readings.pilot_batch(batch) if here or not statistics_given else None
    probes = measure.probe_batches(per_device, sizes) if here else \
        ([] if speed_given else [per_device])
    return measure.plan(opts.job, workers=workers,
                        threads=cores_per_worker(workers if here else 2), pilot_batch=pilot,
                        target=target, pilot_epochs=opts.pilot_epochs, batches=probes,
                        probe_steps=opts.probe_steps, baselines=here and workers >= 2,
                        probe_batch=per_device)


def advise(opts: Options, echo: Callable[[str], None] = print) -> tuple[Advice, Path]:
    """The advice, and the folder it and its measurements go to."""
    cfg = validate(opts)
    flat = cfg.to_dict()
    higher = _higher(cfg, flat, opts)
    target = opts.budget is None
    notes: list[str] = []
    variants = space.variants(opts.strategies, opts.job, notes, opts.exact_only)
    here = not opts.cluster
    workers = opts.devices if here else 0
    devices = space.device_counts(workers if here else None, opts.gpus_per_node, opts.nodes)
    batch, _ = readings.reference(flat)
    per_device = flat.get("batch_size") or batch
    sizes = space.batches(per_device, opts.batch_sizes, 10 ** 7)
    out = Path(opts.out) if opts.out else default_out(flat)
    from parascale.files import check_writable_folder

    check_writable_folder(out)
    plan = _measuring_plan(opts, flat, sizes, workers, target)
    rerun = "always" if opts.remeasure else "never"
    found = measure.run(opts.job, plan, out / "measure", lambda r: _gradient_bytes(r, opts),
                        echo, rerun, opts.quiet_machine)
    basis = _basis(opts, flat, found, higher, notes, workers)
    if here:
        from parascale.runtime.env import cores_per_worker

        basis.threads = cores_per_worker(workers)
    precisions = list(opts.precisions or [flat.get("precision", "fp32")])
    train = basis.stats.train_samples
    basis.wire = _wire(variants, found, basis.speed.gradient_bytes)
    memory = basis.speed.memory

    def largest(v: space.Variant, n: int, precision: str) -> int | None:
        fitting = [b for b in sizes if memory.fits(v.stage, n, b)]
        return fitting[-1] if fitting else None

    cores = None
    if here:
        from parascale.runtime.env import available_cores

        cores = available_cores()
        crowded = [v.label for v in variants if v.helpers and workers + v.helpers > cores]
        if crowded:
            notes.append(f"{', '.join(crowded)}: not searched at {workers} workers here (their "
                         f"helper processes and the workers would outnumber the {cores} cores)")
    candidates = space.candidates(devices, sizes, variants, precisions, largest,
                                  opts.max_accumulate, train, cores)
    if not candidates:
        _nothing_fits(basis, variants, devices, sizes, train)
    forecasts = [forecast(c, basis, opts.lr_rule) for c in candidates]
    described = {"devices": _span(devices), "batches": _span(sizes),
                 "accumulate": opts.max_accumulate,
                 "strategies": [v.label for v in variants], "precisions": precisions}
    return decide(basis, forecasts, opts.lr_rule, _goal_words(flat, opts, higher),
                  described), out


def _span(values: list[int]) -> str:
    return f"{values[0]}-{values[-1]}" if len(values) > 2 else ",".join(map(str, values))


def _nothing_fits(basis: Basis, variants: list[space.Variant], devices: list[int],
                  sizes: list[int], train: int | None) -> None:
    memory = basis.speed.memory
    if train is not None and sizes[0] > train:
        raise UsageError(f"the smallest per-device batch searched ({sizes[0]}) is more than the "
                         f"training set's {train} samples; give --batch-sizes")
    stage = max(v.stage for v in variants)
    need = memory.per_device(stage, devices[-1], 1)
    raise UsageError(f"no device fits the model even sharded: at {devices[-1]} device(s), "
                     f"ZeRO stage {stage} and a per-device batch of 1 it needs "
                     f"{need / 2**30:.3g} GiB per device, over the "
                     f"{(memory.budget or 0) / 2**30:.3g} GiB one holds")


def _gradient_bytes(found: measure.Readings, opts: Options) -> float:
    from parascale.predict import gradient

    for record in ([found.pilot] if found.pilot else []) + found.probes:
        got = gradient.from_record(record) or gradient.counted(record)
        if got:
            return got[0]
    return (opts.params or 1e6) * 4


def _wire(variants: list[space.Variant], found: measure.Readings, size: float
          ) -> dict[str, float | None]:
    """Bytes each variant puts on the wire: a compressor's count on the model where it can be
    built, its element size otherwise (None: not countable, e.g. PowerSGD without the model)."""
    from parascale.predict import gradient

    record = found.pilot or (found.probes[0] if found.probes else None)
    built = gradient.build(record) if record is not None else None
    wire: dict[str, float | None] = {}
    for v in variants:
        make = getattr(v.settings, "compressor", None)
        if make is None:
            continue
        compressor = make()
        if built is not None:
            wire[v.label] = float(compressor.sent_bytes(built))
        elif compressor.elementwise:
            wire[v.label] = size * compressor.bytes_for(1, 4) / 4
        else:
            wire[v.label] = None
    return wire


def _basis(opts: Options, flat: dict[str, Any], found: measure.Readings, higher: bool | None,
           notes: list[str], workers: int) -> Basis:
    figures: list[readings.Figure] = []
    pilot = found.pilot
    unit = (pilot.task_fact("unit", str, "samples"),
            float(pilot.task_fact("units_per_sample", (int, float), 1.0))) if pilot else \
        ("samples", 1.0)
    budget = _budget(opts, workers)
    link, intra, low, high, _ = readings.link_of(found, opts)
    if opts.cluster and opts.records:
        assert link is not None
        model, record = readings.records_speed(opts, link, intra, figures)
        memory = readings.memory_of(pilot or record, opts, flat, opts.params, figures, budget)
        speed = Speed(model, model.gradient_bytes, memory, readings.RECORDS_BAND, low, high,
                      cpu=False)
        figures.append(readings.Figure("links", f"{link.describe()}; inside a node "
                                       f"{intra.describe() if intra else '-'}", "", link.how,
                                       f"{opts.gpus_per_node} devices per node"))
    elif opts.cluster:
        probe = found.probes[0] if found.probes else None
        flops = opts.flops_per_sample or (probe.get("flops", "flops_per_sample") if probe
                                          else None)
        if flops is None:
            raise UsageError("the cluster's compute needs the model's FLOPs per sample: give "
                             "--flops-per-sample F, or let advise count them in a run here")
        how, source = ("given", "--flops-per-sample") if opts.flops_per_sample else \
            ("counted", "torch's FLOP counter in a run here")
        params = opts.params or (probe.get("memory", "split_per_rank")[0]["parameter_count"]
                                 if probe and probe.get("memory", "split_per_rank") else None)
        size = (params or 0) * 4.0 or _gradient_bytes(found, opts)
        assert link is not None
        model, scale = readings.flops_speed(float(flops), how, source, opts,
                                            str(flat.get("precision", "fp32")), size, link,
                                            intra, figures)
        memory = readings.memory_of(pilot or probe, opts, flat, params, figures, budget)
        speed = Speed(model, size, memory, readings.MFU_BAND, low, high, scale, cpu=False)
        figures.append(readings.Figure("links", f"{link.describe()}; inside a node "
                                       f"{intra.describe() if intra else '-'}", "", link.how,
                                       f"{opts.gpus_per_node} devices per node"))
    else:
        model = readings.local_speed(found, link, notes, figures)
        memory = readings.memory_of(pilot, opts, flat, opts.params, figures, budget)
        check = readings.memory_check(memory, found.probes)
        if check is not None:
            figures.append(check)
        speed = Speed(model, model.gradient_bytes, memory, readings.work_band(found, model),
                      low, high)
    stats = readings.statistics(flat, opts, pilot, figures, unit[1], bool(higher),
                                None if opts.cluster else found.probes)
    stats.contention = dict(speed.model.contention)
    subject = (f"{flat.get('task') or flat.get('model')}"
               + ("" if flat.get("task") else f" on {flat.get('dataset')}") + ", "
               + (f"{opts.nodes} node(s) x {opts.gpus_per_node} GPU(s)" if opts.cluster
                  else f"up to {workers} CPU worker(s) here"))
    return readings.to_basis(subject, speed, stats, figures, notes, found, unit)


def _budget(opts: Options, workers: int) -> float | None:
    if opts.device_memory is not None:
        return opts.device_memory
    if opts.cluster:
        return None
    import psutil

    from parascale.batchfind.largest import SHARE_OF_FREE

    return SHARE_OF_FREE * psutil.virtual_memory().available / max(1, workers)
