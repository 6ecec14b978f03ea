"""``parascale predict``'s steps: check the options, read the records and the link, calibrate the
model and compute its curves (:func:`predict`), and write the files (:func:`write`). Nothing here
starts a process; everything but :func:`write` is pure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from parascale.errors import UsageError
from parascale.predict import (calibrate, contention, costs, gradient, limits, table,
                               utilisation)
from parascale.predict.compare import checks
from parascale.predict.interconnect import PRESETS, Link, fit_comm, preset
from parascale.predict.model import MODES, Point
from parascale.predict.prediction import Prediction
from parascale.record import COMM_NAME
from parascale.report.load import RunRecord, load_records
from parascale.safejson import Refused, load

DEFAULT_WORKERS = tuple(2 ** i for i in range(13))  # 1 .. 4096
NAMES = {"json": "prediction.json", "csv": "prediction.csv", "png": "prediction.png"}


@dataclass
class Options:
    sources: list[str]
    comm: str | None = None
    interconnect: str | None = None
    sync: str | None = None
    ps_servers: int = 1
    period: int = 1
    #: the strategy's options given by hand (--sync-option), beside --ps-servers and --period
    sync_options: dict = field(default_factory=dict)
    workers: tuple[int, ...] = DEFAULT_WORKERS
    scaling: str | None = None  # weak | strong | None: the study's modes, else both
    batch_size: int | None = None
    global_batch: int | None = None
    gpus_per_node: int | None = None
    intra_node: str | None = None
    params: float | None = None
    gradient_bytes: float | None = None
    overlap: float | None = None
    noise_scale: float | None = None
    model: str | None = None


def validate(opts: Options) -> None:
    """Every option checked before anything is read: one line each."""
    limits.workers(opts.workers)
    for name in ("gpus_per_node", "ps_servers", "period", "batch_size"):
        limits.option(name.replace("_", "-"), getattr(opts, name), 1, limits.MAX_COUNT,
                      "a whole number")
    limits.option("global-batch", opts.global_batch, 1, limits.MAX_COUNT ** 2, "a whole number")
    if (opts.comm is None) == (opts.interconnect is None) and opts.gpus_per_node is None:
        raise UsageError("give the interconnect: --comm DIR (fitted to a 'parascale comm' "
                         "record) or --interconnect PRESET (one of "
                         f"{', '.join(PRESETS)}), not both")
    if opts.gpus_per_node is not None:
        if opts.interconnect is None:
            raise UsageError("--gpus-per-node needs --interconnect PRESET for the link between "
                             "nodes (the link inside a node: --comm DIR or --intra-node PRESET)")
        if opts.comm is not None and opts.intra_node is not None:
            raise UsageError("--comm and --intra-node both name the link inside a node; give one")
    elif opts.intra_node is not None:
        raise UsageError("--intra-node applies only with --gpus-per-node G")
    if opts.sync is not None and opts.sync not in costs.names():
        raise UsageError(f"--sync: unknown strategy {opts.sync!r}; predict models "
                         f"{', '.join(costs.names())}")
    if opts.params is not None and opts.gradient_bytes is not None:
        raise UsageError("--params and --gradient-bytes both give the gradient's size; give one")
    limits.option("params", opts.params, 1, limits.MAX_BYTES / 4, "a parameter count")
    limits.option("gradient-bytes", opts.gradient_bytes, 1, limits.MAX_BYTES, "a size in bytes")
    limits.option("overlap", opts.overlap, 0, 1, "a share of compute")
    if opts.noise_scale is not None and not (
            limits.within(opts.noise_scale, 0, limits.MAX_SAMPLES) and opts.noise_scale > 0):
        raise UsageError(f"--noise-scale must be a positive number of samples up to "
                         f"{limits.MAX_SAMPLES:g}, got {opts.noise_scale}")
    if opts.scaling is not None and opts.scaling not in MODES:
        raise UsageError(f"--scaling must be weak or strong, got {opts.scaling!r}")


def read_comm(path: str) -> Link:
    """The link fitted to ``path`` (a comm.json or the folder holding one)."""
    file = Path(path)
    if file.is_dir():
        file = file / COMM_NAME
    if not file.is_file():
        raise UsageError(f"--comm {path}: no {COMM_NAME} there; make one with "
                         "'parascale comm --workers N --out DIR'")
    try:
        data = load(file)
    except Refused as exc:
        raise UsageError(f"--comm {path}: cannot read it ({exc})") from None
    return fit_comm(data, f"--comm {path}")


def _records(opts: Options) -> tuple[list[RunRecord], list[str], list[RunRecord]]:
    """The ok, non-baseline records of one model, notes about what was left out, and the
    model's contention baselines."""
    try:
        loaded = load_records(opts.sources)
    except UsageError as exc:  # load_records speaks as 'report'; this is predict
        raise UsageError(str(exc).removeprefix("report: ")) from None
    from parascale.report.inplan import keep_planned

    loaded = keep_planned(loaded)
    notes = [f"left out {p.path}: {p.reason}" for p in loaded.problems]
    records = calibrate.usable(loaded.records)
    if not records:
        raise UsageError(f"no finished run record in {', '.join(opts.sources)} (status ok, not a "
                         "baseline); predict needs at least one")
    models = sorted({(r.model, r.dataset) for r in records})
    if opts.model is not None:
        records = [r for r in records if r.model == opts.model]
        if not records:
            raise UsageError(f"--model {opts.model!r}: no record of it; the records hold "
                             + ", ".join(m for m, _ in models))
    elif len(models) > 1:
        raise UsageError("the records hold several models or data sets ("
                         + ", ".join(f"{m} on {d}" for m, d in models)
                         + "); choose one with --model NAME")
    return records, notes, contention.baselines(loaded.records, records[0].model,
                                                records[0].dataset)


def _strategy(opts: Options, records: list[RunRecord]) -> costs.Strategy:
    name = opts.sync
    if name is None:
        syncs = sorted({r.sync for r in records})
        if len(syncs) > 1 or syncs[0] not in costs.names():
            raise UsageError(f"the records ran with --sync {', '.join(syncs)}; choose the "
                             f"strategy to predict with --sync (one of "
                             f"{', '.join(costs.names())})")
        name = syncs[0]
    # the records' own options (each a key of a record's config), unless given
    sample = next((r for r in records if r.sync == name), None)
    recorded = gradient.options_of(sample) if sample is not None else {}
    given = {**opts.sync_options, **{k: getattr(opts, k) for k in ("ps_servers", "period")
                                      if getattr(opts, k) != 1}}
    where = f"{sample.path}" if sample is not None else "--sync-option"
    found = costs.strategy(name, {**recorded, **given}, where)
    limits.field(where, "its strategy's servers", found.servers, 1, limits.MAX_COUNT, "servers")
    limits.field(where, "its strategy's period", found.every, 1, limits.MAX_COUNT, "steps")
    return found


def _settings(records: list[RunRecord], name: str) -> list:
    """The settings of every record of strategy ``name``, as the registry reads them."""
    from parascale import sync

    return [sync.read_settings(name, gradient.options_of(r), str(r.path))
            for r in records if r.sync == name]


def predict(opts: Options) -> Prediction:
    validate(opts)
    records, notes, baselines = _records(opts)
    strategy = _strategy(opts, records)
    if opts.comm is not None:
        local = read_comm(opts.comm)
        backend = local.fit.get("backend") if local.fit else None
        ran = sorted({str(r.get("environment", "backend", default="?")) for r in records})
        if backend and ran != [backend]:
            notes.append(f"the comm record was measured with {backend}, the runs with "
                         f"{', '.join(ran)}: the fitted link is {backend}'s")
    else:
        local = None
    if opts.gpus_per_node is not None:
        link = preset(opts.interconnect)
        intra = local or preset(opts.intra_node or "nvlink")
    else:
        link, intra = local or preset(opts.interconnect), None
    given = None
    if opts.params is not None:
        given = (opts.params * 4, f"--params {opts.params:.4g}, 4 bytes each (fp32 gradients)")
    elif opts.gradient_bytes is not None:
        given = (opts.gradient_bytes, "--gradient-bytes")
    model = calibrate.build(records, strategy, link, intra=intra, per_node=opts.gpus_per_node,
                            given_bytes=given, given_overlap=opts.overlap,
                            given_noise=opts.noise_scale, strategy_given=opts.sync is not None,
                            notes=notes)
    refs = calibrate.reference(records)
    model.contention, measured_compute = contention.factors(baselines, model.work,
                                                            refs[0].record.workers)
    model.inputs[1:1] = measured_compute  # beside compute(b), the figure they replace at N
    batch = opts.batch_size or max(p.batch for p in refs)
    modes = [opts.scaling] if opts.scaling else \
        sorted({r.scaling for r in records if r.scaling in MODES}) or list(MODES)
    strong_batch = opts.global_batch or next(
        (r.get("derived", "global_batch") for r in records if r.scaling == "strong"), None) \
        or _own_global_batch(refs) or batch
    if strategy.every == 1 and strategy.name != costs.TREE.name:
        from parascale import sync

        kind = sync.get(strategy.name)
        loose = sorted({" ".join(s.changed()) for s in _settings(records, strategy.name)
                        if not kind.lockstep(s)})
        if loose:
            notes.append(f"the records ran {'; '.join(loose)}, which waits for no one; it is "
                         "predicted as synchronous (an upper bound on its step time)")
    workers = sorted(set(opts.workers))
    curves = {mode: model.curve(mode, workers, batch, strong_batch) for mode in modes}
    _check_finite(curves)
    if "strong" in curves and len(curves["strong"]) < len(workers):
        notes.append(f"strong scaling stops at N = {int(strong_batch)}: a global batch of "
                     f"{int(strong_batch)} leaves less than one sample per device beyond it "
                     "(--global-batch B for another)")
    if model.work.fixed_s == 0 and "strong" in curves:
        notes.append("strong scaling assumes compute proportional to the per-device batch "
                     "(records at one batch only); small batches often run less efficiently")
    if opts.gpus_per_node is None and max(workers) > 1 and opts.comm is not None:
        width = local.fit.get("world_size") if local and local.fit else None
        if width and max(workers) > width:
            notes.append(f"the link was measured on {width} workers; beyond that it is assumed "
                         "to stay the same (one switch, no contention between links)")
    notes += _shared_cores(records, [n for n in workers if n not in model.contention])
    first = records[0]
    subject = (f"{first.model} on {first.dataset}, --sync {strategy.name}, "
               f"{len(records)} record(s) from {', '.join(opts.sources)}")
    measured = [c for c in checks(records, model) if c.mode in curves]
    return Prediction(subject, model, curves, measured, notes,
                      [str(s) for s in opts.sources], utilisation.from_records(records))


def _own_global_batch(refs: list[calibrate.Phases]) -> int | None:
    """The global batch the reference runs trained with (the largest, if they differ): what
    strong scaling keeps when no record ran strong scaling. A single run of 2 workers at 32 a
    device keeps its 64 (a 1-worker reference's is its per-device batch); None when no record
    states it."""
    found = [limits.field(p.record.path, "derived.global_batch", g, 1, limits.MAX_COUNT ** 2,
                          "samples")
             for p in refs if (g := p.record.get("derived", "global_batch")) is not None]
    return int(max(found)) if found else None


def _check_finite(curves: dict[str, list[Point]]) -> None:
    """Inputs in range give finite figures; should a combination still overflow, one line
    rather than Infinity in prediction.json (not JSON) or a table of inf."""
    for points in curves.values():
        for p in points:
            bad = [k for k, v in p.to_dict().items() if isinstance(v, float)
                   and not limits.within(v, -limits.MAX_SECONDS * 1e12, limits.MAX_SECONDS * 1e12)]
            if bad:
                raise UsageError(f"the inputs give a {', '.join(bad)} beyond any machine at N = "
                                 f"{p.workers} ({p.mode} scaling); check the figures listed "
                                 "with --workers 1 and the records' step times")


def _shared_cores(records: list[RunRecord], workers: list[int]) -> list[str]:
    """A note when the records ran on CPUs and some N would fill their machine's cores: the
    model sees separate devices, not processes competing for one machine (docs/predict.md)."""
    ref = calibrate.reference(records)[0].record
    if ref.get("environment", "device_type") != "cpu":
        return []
    cores = ref.get("machine", "cores", default=ref.get("environment", "cpu_count"))
    threads = ref.get("derived", "threads_per_worker", default=1)
    if not isinstance(cores, int) or not isinstance(threads, int) or threads < 1:
        return []
    full = [n for n in workers if n > 1 and n * threads >= cores]
    if not full:
        return []
    return [f"the records ran on CPUs ({threads} thread(s) per worker, {cores} cores): from "
            f"N = {full[0]} on that one machine, workers and gloo's threads compete for its cores, "
            "which the model does not see without a baseline at that N (it predicts separate "
            "devices); there, expect less. 'parascale bench --baseline' measures that "
            "contention, and predict uses it"]


def write(pred: Prediction, out: str | Path) -> list[Path]:
    """prediction.json, .csv and .png into ``out``, each atomically."""
    from parascale.files import atomic_write_bytes, atomic_write_text
    from parascale.predict import plot

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    png = plot.render(pred)  # drawn before anything is written: a failure leaves nothing
    return [atomic_write_text(folder / NAMES["json"], table.to_json(pred)),
            atomic_write_text(folder / NAMES["csv"], table.to_csv(pred)),
            atomic_write_bytes(folder / NAMES["png"], png)]
