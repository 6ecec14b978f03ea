"""From a study's inputs to the list of jobs it runs, every one checked before the first starts.

Inputs come from a study file, the ``train`` options given to ``bench``, ``-P``/``-V`` and the
scaling options; :func:`combine` merges them (the command line wins over the file) and
:func:`make_jobs` expands them with the planner, applies weak or strong scaling, adds the
contention baselines and the repeats, and runs the trainer's own input checks on every
configuration. A study that cannot run fails here with one UsageError, before anything is written.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parascale import sync
from parascale.batch import derive, indivisible
from parascale.bench import expr, scripts
from parascale.bench.plan import (PlanError, PlannedRun, build_plan, format_plan_table,
                                  parse_workers, scaling_configs)
from parascale.config import NAMES, TUPLE_FIELDS, TrainConfig, field_kinds
from parascale.digits import INT_RE
from parascale.validation import validate
from parascale.runtime.env import available_cores, cores_per_worker
from parascale.errors import UsageError
from parascale.files import check_writable_folder

__all__ = ["Job", "StudyInputs", "combine", "make_jobs", "plan_table", "max_workers",
           "interleave", "reference_warning", "STUDY_NAMES", "SCALINGS"]

SCALINGS = ("weak", "strong")
# names bench itself understands; never passed to train (a script's: bench/scripts.py)
STUDY_NAMES = frozenset({"scaling", scripts.SCRIPT, scripts.SCRIPT_ARGS})
BATCH_FIELDS = frozenset({"batch_size", "global_batch"})
# options that do not change how much memory a run needs: ignored when an out-of-memory result
# decides which larger batches of "the same model on the same devices" to skip
MEMORY_NEUTRAL = frozenset({
    "out", "save_model", "port", "timeout", "seed", "epochs", "steps", "lr", "lr_scaling",
    "base_batch", "warmup_epochs", "lr_schedule", "lr_milestones", "lr_gamma", "weight_decay",
    "target_accuracy", "target_metric", "target_value", "stop_at_target", "eval_every",
    "eval_batches",
    "download", "warmup_steps", "lr_min", "peak_tflops", "tensorboard"})
_COMPUTED_RE = re.compile(r"\s*\$\((.*)\)\$\s*\Z", re.S)


@dataclass
class StudyInputs:
    """A whole study before expansion: DLBS's parameters, variables and extensions."""

    parameters: dict[str, Any] = field(default_factory=dict)
    variables: dict[str, list[Any]] = field(default_factory=dict)
    extensions: list[dict[str, Any]] = field(default_factory=list)
    repeat: int = 1
    baseline: bool = False


@dataclass
class Job:
    """One training run of the study (one configuration, one repeat)."""

    config_id: str  # the configuration, shared by its repeats; baselines end in -baseline
    folder: str  # runs/<folder>: the config id, with -r<k> for repeats after the first
    params: dict[str, Any]  # every resolved study value, helper names included
    train: dict[str, Any]  # the TrainConfig input (without out)
    world_size: int
    per_device_batch: int | None
    global_batch: int | None
    scaling: str | None = None
    repeat: int = 1
    baseline: bool = False
    skip_reason: str | None = None
    memory_key: str = ""  # jobs with equal keys differ only in batch for memory purposes
    label: str = ""  # short description for progress lines


#: how many workers a study planned for other machines (a Slurm allocation) may ask for
_ELSEWHERE: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "parascale_workers_elsewhere", default=None)


@contextlib.contextmanager
def workers_elsewhere(count: int):
    """Plan worker lists ('all', 'pow2', 1,2,...,N) against ``count`` workers, not this
    machine's cores or GPUs: ``parascale slurm bench`` runs its study on the cluster's nodes."""
    token = _ELSEWHERE.set(count)
    try:
        yield
    finally:
        _ELSEWHERE.reset(token)


def max_workers(parameters: Mapping[str, Any]) -> int:
    """How many workers a worker list may ask for: the GPUs given or visible, else CPU cores."""
    if _ELSEWHERE.get() is not None:
        return _ELSEWHERE.get()
    gpus = parameters.get("gpus")
    if isinstance(gpus, str):
        gpus = [g for g in gpus.split(",") if g.strip()]
    if isinstance(gpus, (list, tuple)) and gpus:
        return len(gpus)
    if parameters.get("device") == "cuda":
        import torch

        if torch.cuda.device_count() < 1:
            raise UsageError("device cuda: no CUDA device is visible on this machine")
        return torch.cuda.device_count()
    return available_cores()


def combine(file: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
            assignments: Iterable[tuple[str, Any]] = (),
            variables: Iterable[tuple[str, list[Any]]] = (), scaling: str | None = None,
            workers: str | None = None, repeat: int = 1, baseline: bool = False) -> StudyInputs:
    """Merge a study file with the command line; a name given on the command line replaces the
    file's parameter or variable of that name. ``workers`` is a list spec ('1,2,4', 'pow2', ...)."""
    file = file or {}
    params = dict(file.get("parameters", {}))
    varis = {k: list(v) if isinstance(v, (list, tuple)) else v
             for k, v in file.get("variables", {}).items()}
    cli_params = dict(options or {})
    for name, value in assignments:
        cli_params[name] = value
    if scaling is not None:
        cli_params["scaling"] = scaling
    cli_vars = dict(variables)
    both = sorted(set(cli_params) & set(cli_vars))
    if both:
        raise UsageError(f"{both[0]} is given both as a fixed parameter and as a variable "
                         f"(-V {both[0]}=...); give it once")
    if workers is not None:
        if "workers" in cli_params or "workers" in cli_vars:
            raise UsageError("give the worker counts once: --workers SPEC or -P/-V workers=...")
        cli_vars["workers"] = parse_workers(workers, max_workers({**params, **cli_params}))
    for name, value in cli_params.items():
        params[name] = value
        varis.pop(name, None)
    for name, values in cli_vars.items():
        varis[name] = values
        params.pop(name, None)
    if (params.get("scaling") is not None or "scaling" in varis) \
            and "workers" not in params and "workers" not in varis:
        # default sweep: powers of two up to every device, and every device itself
        top = max_workers(params)
        varis["workers"] = sorted(set(parse_workers("pow2", top)) | {top})
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise UsageError(f"--repeat must be a positive integer, got {repeat!r}")
    return StudyInputs(params, varis, list(file.get("extensions", [])), repeat, baseline)


def _walk_strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _walk_strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _walk_strings(item)


def _names_in(text: str, expression: bool = False) -> set[str]:
    match = _COMPUTED_RE.match(text)
    code = match.group(1) if match else text[1:] if text.startswith("=") else \
        text if expression else None
    found = set(expr.REF_RE.findall(text))
    if code is not None:
        try:
            found |= expr.names(code)
        except expr.ExprError:
            pass  # the planner reports the syntax error with its context
    return found


def referenced_names(inputs: StudyInputs) -> set[str]:
    """Every name some value, condition or skip reason of the study refers to."""
    found: set[str] = set()
    for text in _walk_strings([inputs.parameters, inputs.variables]):
        found |= _names_in(text)
    for ext in inputs.extensions:
        if isinstance(ext, Mapping):
            if isinstance(ext.get("condition"), str):
                found |= _names_in(ext["condition"], expression=True)
            for text in _walk_strings([ext.get("parameters", {}), ext.get("cases", []),
                                       ext.get("skip", "")]):
                found |= _names_in(text)
    return found


def _coerce(name: str, value: Any) -> Any:
    """Friendly conversions for values computed or typed in a study: 16.0 -> 16, '0,1' -> [0, 1]."""
    kind = field_kinds()[name][0] if name in NAMES else sync.options()[name][0].kind
    if name in TUPLE_FIELDS:
        if isinstance(value, str):  # ASCII digits only: int() also reads '５'
            items = [v.strip() for v in value.split(",") if v.strip()]
            return [int(v) for v in items] if all(INT_RE.fullmatch(v) for v in items) else value
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
    elif kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    elif kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _flagged() -> set[str]:
    """Strategy options with a flag of their own, which a run's settings hold as keys of their
    own; the others travel in sync_options, as --sync-option gives them (-P/-V name=value all
    the same)."""
    return {name for name, (option, _) in sync.options().items() if option.flag}


def _split(run: PlannedRun, referenced: set[str]) -> tuple[dict[str, Any], str | None]:
    """The run's TrainConfig input and its scaling mode; unknown unreferenced names are typos."""
    train: dict[str, Any] = {}
    for name, value in run.params.items():
        if name in NAMES or name in _flagged():
            if name == "out":
                raise UsageError("out is chosen by bench (STUDY/runs/<configuration>/); "
                                 "give the study folder with --out")
            if name == "tensorboard":  # as out: where runs write is no setting of a run
                raise UsageError("tensorboard is one folder for the whole study (each run "
                                 "writes into DIR/<configuration>): give --tensorboard DIR")
            train[name] = _coerce(name, value)
        elif name in sync.options():  # a strategy's option without a flag of its own
            train.setdefault("sync_options", {})[name] = value
        elif name not in STUDY_NAMES and name not in referenced:
            close = difflib.get_close_matches(name, [*NAMES, *sync.options(),
                                                     *STUDY_NAMES], n=1)
            hint = f"; did you mean {close[0]}?" if close else \
                "; a helper name must be used by another value (${name})"
            raise UsageError(f"unknown parameter {name!r}: not a train option{hint}")
    scaling = run.params.get("scaling")
    if scaling is not None and scaling not in SCALINGS:
        raise UsageError(f"scaling must be weak or strong, got {scaling!r}")
    return train, scaling


def _fit_gpus(train: dict[str, Any]) -> None:
    """With a GPU list and a worker count, N workers use the first N GPUs of the list."""
    gpus, workers = train.get("gpus"), train.get("workers")
    if isinstance(gpus, list) and isinstance(workers, int) and 0 < workers < len(gpus):
        train["gpus"] = gpus[:workers]


class _Checker:
    """The trainer's own preflight for each distinct configuration (data, model, batch fit);
    each distinct data set is built, and each model probed, once for the whole study."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Any]] = {}
        self.memo: dict[str, Any] = {}
        self.warned: set[str] = set()

    def __call__(self, cfg: TrainConfig, size: int) -> dict[str, Any]:
        """``cfg`` (which ``_job`` validated) through the trainer's checks, once."""
        from parascale.training.launch.preflight import plan_checked

        key = json.dumps([cfg.to_dict(), size], sort_keys=True, default=str)
        if key not in self.seen:
            self.seen[key] = {} if self._elsewhere(cfg) else \
                plan_checked(cfg, size, self.memo).record_section()
        return self.seen[key]

    def _elsewhere(self, cfg: TrainConfig) -> bool:
        """For a study planned for a cluster (``slurm bench``): a --data-dir this machine does
        not have may be one only the compute nodes mount. Like ``slurm train``, say so once and
        leave the data (and the batch's fit to it) to the job, which checks them there; the
        model and the strategy are still checked here."""
        from parascale import data, models

        if _ELSEWHERE.get() is None or not data.elsewhere(cfg):
            return False
        models.check(cfg.job.model)
        sync.check(cfg.strategy.sync)
        if cfg.data.data_dir not in self.warned:
            self.warned.add(cfg.data.data_dir)
            print(f"parascale: warning: --data-dir {cfg.data.data_dir} is not on this machine; the "
                  "jobs read it on the nodes (and say so if it is missing there too)",
                  file=sys.stderr, flush=True)
        return True


def _memory_key(cfg: TrainConfig, size: int) -> str:
    data = {k: v for k, v in cfg.to_dict().items() if k not in MEMORY_NEUTRAL | BATCH_FIELDS}
    data["workers"] = size
    return json.dumps(data, sort_keys=True, default=str)


def _drop_foreign_options(train: dict[str, Any], used: list[dict[str, Any]]) -> None:
    """A strategy's option applies to the configurations of that strategy only.

    ``-V sync=allreduce,local-sgd -P period=4`` compares two strategies; ``period`` means
    nothing to allreduce, so it is left out of that configuration (it stays in the study's
    params). An option that applies to no configuration of the study (``used``: their params)
    is left in, and validation says so.
    """
    extra = train.get("sync_options", {})
    for name in sync.options():
        if not sync.applies(name, train) and any(sync.applies(name, p) for p in used):
            train.pop(name, None)
            extra.pop(name, None)


def _job(run: PlannedRun, referenced: set[str], check: _Checker,
         used: list[dict[str, Any]]) -> Job:
    from parascale.training import world_size_for

    train, scaling = _split(run, referenced)
    _drop_foreign_options(train, used)
    if scripts.is_script(run.params):
        return _script_job(run, train, scaling)
    skip = run.skip_reason
    if scaling is not None:
        if train.get("workers") is None:
            raise UsageError(f"{scaling} scaling needs worker counts: --workers 1,2,4 or "
                             "-V workers=...")
        try:
            _, _, _, reason = scaling_configs(scaling, [train["workers"]],
                                              batch_size=train.get("batch_size"),
                                              global_batch=train.get("global_batch"))[0]
        except PlanError as exc:
            flag = "--batch-size" if scaling == "weak" else "--global-batch"
            raise PlanError(f"{exc} ({flag} or -P/-V {flag[2:].replace('-', '_')}=...)") \
                from None
        skip = skip or reason
    _fit_gpus(train)
    try:
        cfg = TrainConfig.from_dict(train)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"configuration {run.config_id}: {exc}") from None
    validate(cfg)
    size = world_size_for(cfg)
    per_device = global_batch = None
    if skip is None and scaling == "strong":  # a point of the plan, skipped with the reason
        skip = indivisible(cfg.batch.global_batch, size, cfg.batch.accumulate)
    if skip is None:
        derived = derive(cfg, size, sync.strategy_of(cfg).replicas_per_device(cfg))
        per_device, global_batch = derived.per_device_batch, derived.global_batch
    if skip is None:
        check(cfg, size)
    return Job(run.config_id, run.config_id, dict(run.params), train, size, per_device,
               global_batch, scaling, skip_reason=skip, memory_key=_memory_key(cfg, size))


def with_tensorboard(jobs: list[Job], folder: str | None) -> list[Job]:
    """``jobs`` writing TensorBoard series under ``folder`` (--tensorboard), each run into a
    folder of its own (:func:`run_train`). Set on the jobs, not planned as a value: the study's
    configurations, and so its folders, stay what they are with or without it."""
    if folder:
        check_writable_folder(folder, "--tensorboard")
        for job in jobs:
            job.train["tensorboard"] = os.path.abspath(folder)
    return jobs


def run_train(job: Job) -> dict[str, Any]:
    """The train options ``job`` runs with: a study's --tensorboard DIR becomes
    DIR/<the run's folder>, so that each run has series of its own and TensorBoard lists the
    runs by their configuration."""
    train = dict(job.train)
    if train.get("tensorboard"):
        train["tensorboard"] = os.path.join(os.path.abspath(train["tensorboard"]), job.folder)
    return train


def _script_job(run: PlannedRun, train: dict[str, Any], scaling: str | None) -> Job:
    """A run of the study's script: checked as ``parascale run`` checks its input. Its batch
    is the script's, unknown until it runs (the record then says it)."""
    from parascale.script.launch import checked

    if scaling is not None:
        raise UsageError("--scaling sets the batch parascale trains with, and a script sets its "
                         "own: give --workers, and the batch in the script's arguments (-P "
                         "'b=$(256 // ${workers})$' -P 'script_args=--batch-size ${b}' keeps "
                         "a global batch of 256)")
    _fit_gpus(train)
    script = scripts.check_job(train, run.params)
    try:
        cfg, size = checked(train)  # parascale run's own checks: devices, cores, strategy
    except (TypeError, ValueError) as exc:
        raise UsageError(f"configuration {run.config_id}: {exc}") from None
    return Job(run.config_id, run.config_id, {**run.params, scripts.SCRIPT: str(script)}, train,
               size, None, None, skip_reason=run.skip_reason,
               memory_key=_memory_key(cfg, size) + str(script))


def _order(jobs: list[Job]) -> list[Job]:
    """Within each memory key, smaller per-device batches first (so an OOM can skip the rest);
    everything else keeps its place in the plan."""
    slots: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        if job.skip_reason is None and job.per_device_batch is not None:
            slots.setdefault(job.memory_key, []).append(i)
    ordered = list(jobs)
    for indices in slots.values():
        group = sorted((jobs[i] for i in indices), key=lambda j: j.per_device_batch)
        for i, job in zip(indices, group):
            ordered[i] = job
    return ordered


def _baseline(job: Job) -> Job:
    train = {**job.train, "sync": sync.BASELINE, "sync_options": {}}
    cfg = TrainConfig.from_dict(train)
    validate(cfg)
    return dataclasses.replace(
        job, config_id=f"{job.config_id}-baseline", folder=f"{job.config_id}-baseline",
        params={**job.params, "sync": sync.BASELINE}, train=train, baseline=True,
        memory_key=_memory_key(cfg, job.world_size))


def _labels(jobs: list[Job], repeat: int) -> None:
    """'workers=2 batch=32 (global 64) lr=0.1 ...': the values that vary, for progress lines."""
    names: list[str] = []
    for job in jobs:
        names += [n for n in job.params if n not in names]
    shown = [n for n in names if n not in BATCH_FIELDS | {"workers", "sync", "scaling"}
             and len({json.dumps(j.params.get(n), default=str) for j in jobs}) > 1]
    for job in jobs:
        parts = [job.scaling] if job.scaling else []
        parts.append(f"workers={job.world_size}")
        if job.per_device_batch is not None:
            parts.append(f"batch={job.per_device_batch} (global {job.global_batch})")
        parts += [f"{n}={expr.to_text(job.params.get(n))}" for n in shown]
        if job.baseline:
            parts.append("baseline: no sync")
        elif (job.train.get("sync") or sync.DEFAULT) != sync.DEFAULT:
            parts.append(f"sync={job.train['sync']}")
        if repeat > 1:
            parts.append(f"repeat {job.repeat}/{repeat}")
        job.label = " ".join(parts)


def _fix_threads(jobs: list[Job]) -> None:
    """Give CPU workers the same thread count at every N: cores / the largest N.

    Otherwise one worker would use every core and N workers one core each, and the study would
    compare data parallelism with intra-op threading instead of one device with N devices.
    """
    cpu = [j for j in jobs if not j.train.get("gpus") and j.train.get("device", "auto") != "cuda"]
    if cpu and all(j.train.get("threads") is None for j in cpu):
        threads = cores_per_worker(max(j.world_size for j in cpu))
        for job in cpu:
            job.train["threads"] = job.params["threads"] = threads


def make_jobs(inputs: StudyInputs) -> list[Job]:
    """Every job of the study in run order: repeats in rounds, each baseline after its run.

    Rounds (every configuration once, then every one again: ABAB..., as benchmark suites run
    them) make slow drift on a shared machine (another job starting, a thermal limit) hit every
    configuration alike instead of all repeats of one.
    """
    from parascale.runtime import external_launcher

    if external_launcher():
        raise UsageError(f"bench starts its own training jobs: run it directly, not under "
                         f"{external_launcher()}")
    runs = build_plan(inputs.parameters, inputs.variables, inputs.extensions)
    referenced = referenced_names(inputs)
    check = _Checker()
    used = [run.params for run in runs]
    jobs = _order([_job(run, referenced, check, used) for run in runs])
    _fix_threads(jobs)
    if inputs.baseline:
        jobs = [j for job in jobs for j in
                ([job, _baseline(job)] if job.world_size > 1 and job.skip_reason is None
                 and job.train.get("sync") != sync.BASELINE else [job])]
    rounds = []
    for k in range(1, inputs.repeat + 1):
        rounds += [dataclasses.replace(job, repeat=k, params=dict(job.params),
                                       folder=job.folder if k == 1 else f"{job.folder}-r{k}")
                   for job in jobs]
    _labels(rounds, inputs.repeat)
    return rounds


def interleave(*studies: Sequence[Job]) -> list[Job]:
    """Several studies' jobs run as one, in rounds across all of them: round 1 of each study,
    then round 2 of each, ... (the order inside a study's round is kept)."""
    indexed = [(job.repeat, number, i, job) for number, jobs in enumerate(studies)
               for i, job in enumerate(jobs)]
    return [job for *_, job in sorted(indexed, key=lambda item: item[:3])]


def reference_warning(jobs: Sequence[Job]) -> str | None:
    """What the summary will not be able to say because the plan has no 1-worker run."""
    counts = sorted({job.world_size for job in jobs if job.skip_reason is None})
    if not counts or counts[0] == 1:
        return None
    if len(counts) == 1:
        return (f"one worker count ({counts[0]}) and no 1-worker run: the summary shows "
                f"throughput but no speedup or efficiency (add --workers 1,{counts[0]}, or "
                "--scaling weak|strong for a whole study)")
    return (f"no 1-worker run: the summary shows no speedup, only throughput relative to "
            f"{counts[0]} workers and an efficiency relative to them (add 1 to --workers for a "
            "speedup)")


def plan_table(jobs: Sequence[Job], repeat: int = 1) -> str:
    """The --dry-run table: each configuration (first round) with its resolved batch figures."""
    def params(job: Job) -> dict[str, Any]:
        # a learner's --batch-size is its own; the device's batch is learners times it
        own = sync.traits_of(job.train.get("sync")).learners and job.train.get("batch_size")
        figures = {"workers": job.world_size,
                   "batch_size": own or job.per_device_batch or job.train.get("batch_size"),
                   "global_batch": job.global_batch or job.train.get("global_batch"),
                   "sync": job.train.get("sync") or sync.DEFAULT}
        return {**job.params, **{k: v for k, v in figures.items() if v is not None}}

    shown = [PlannedRun(job.config_id, params(job), job.skip_reason)
             for job in jobs if job.repeat == 1]
    table = format_plan_table(shown)
    fixed = {name: value for name, value in shown[0].params.items()
             if all(json.dumps(run.params.get(name), default=str)
                    == json.dumps(value, default=str) for run in shown)} if shown else {}
    if fixed:
        table = "every run: " + " ".join(f"{name}={expr.to_text(value)}"
                                         for name, value in fixed.items()) + "\n" + table
    if repeat > 1:
        table += f"; each run {repeat} times ({len(jobs)} runs in all)"
    return table

