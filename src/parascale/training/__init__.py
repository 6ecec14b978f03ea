"""``parascale.train(config)``: the one entry point the CLI, studies, searches and users call.

On one machine it starts the workers itself; under torchrun or srun this process *is* a worker
and joins that world. Either way bad input is found here, before any worker starts or anything
is written: names, sizes, data files, whether the model accepts the data, whether the global
batch divides and fits the data set, whether --out can be written, and (for a local launch)
whether the machine has the cores for the workers and threads asked for.

A local run's workers write into a staging folder beside --out; the results replace the previous
ones in --out only when the run has its own (see :mod:`parascale.runtime.staging`): the record,
the model and the console log (``log.txt``). Checkpoints are not results: they live in
``--out/checkpoints`` from the moment they are written, beside the unfinished run's log, so
that they outlast a failure, a restart and the launcher itself (docs/checkpoints.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from parascale import data, models, sync
from parascale.batch import Plan, make_plan
from parascale.config import TrainConfig, check_run_folder, validate
from parascale.runtime.env import (CHECKPOINTS_ENV, LOG_ENV, RESUME_ENV, available_cores,
                                   cores_per_worker)
from parascale.errors import UsageError
from parascale.files import check_writable_folder
from parascale.runtime import (check_oversubscription, external_launcher, external_size, launch,
                               open_store, resolve_backend, resolve_device_type)
from parascale.runtime.staging import produce
from parascale.runtime import faults
from parascale import record as rec
from parascale.training import checkpoint, resume
from parascale.training.console import ConsoleLog
from parascale.training.loop import run_worker

__all__ = ["train", "preflight", "world_size_for"]


def world_size_for(cfg: TrainConfig) -> int:
    """Workers this run will have: torchrun's/srun's world, the GPU list, --workers, or cores."""
    if external_launcher():
        return external_size()
    if cfg.gpus:
        return len(cfg.gpus)
    return cfg.workers or available_cores()


def threads_per_worker(cfg: TrainConfig, size: int) -> int:
    """--threads, or the cores shared among the workers (at least one each)."""
    return cfg.threads or cores_per_worker(size)


def preflight(cfg: TrainConfig, size: int, memo: dict | None = None) -> dict[str, Any]:
    """Everything that can be wrong with the input, checked in this process; the derived numbers.

    Each distinct data set is built once in this process and kept for the local workers
    (``data.prepare``). A caller checking many configurations (a study) passes the same
    ``memo`` dict each time: each model is then probed once per input shape, not once per
    configuration.
    """
    validate(cfg)
    faults.check()  # a malformed PARASCALE_FAULT would fail in every worker
    sync.check(cfg.sync)
    models.check(cfg.model)
    with _no_new_folders_on_error(cfg.data_dir if cfg.download else None):
        data.check(cfg)
    device_type = resolve_device_type(cfg.device, cfg.gpus)
    resolve_backend(cfg.backend, device_type)
    if cfg.sync_batchnorm and device_type != "cuda":
        raise UsageError("--sync-batchnorm needs CUDA devices (torch's SyncBatchNorm runs only "
                         "on GPUs); leave it out on CPU workers")
    if cfg.out:
        check_writable_folder(cfg.out)
        resume.refuse_fresh_start(cfg)
    memo = {} if memo is None else memo
    # built once per data set in this process, and handed to the local workers (data.handover)
    facts = data.prepare(cfg, keep=not external_launcher())
    num_classes, input_shape = facts["num_classes"], facts["input_shape"]
    plan = make_plan(cfg, size, facts["train"], facts["test"])
    if plan.steps_per_epoch == 0:
        raise UsageError(_batch_too_large(cfg, plan, size))
    if not external_launcher():  # a torchrun or srun world is what it is
        servers = cfg.ps_servers if cfg.sync == "parameter-server" else 0
        check_oversubscription(size, threads_per_worker(cfg, size), available_cores(), servers,
                               insist=cfg.oversubscribe)
    model_key = json.dumps(["model", cfg.model, num_classes, input_shape])
    if model_key not in memo:
        model = models.build(cfg.model, num_classes, input_shape)
        models.probe(model, input_shape, num_classes)
        memo[model_key] = True
    return plan.record_section()


def _batch_too_large(cfg: TrainConfig, plan: Plan, size: int) -> str:
    """Why no step fits the training set, and what would fit, with the numbers."""
    n, name = plan.train_samples, cfg.dataset
    micro = cfg.accumulate
    per_device = plan.derived.per_device_batch
    if cfg.global_batch is not None:
        fits = n // (size * micro) * size * micro
        advice = f"use --global-batch {fits} or less" if fits else \
            f"use at most {n // micro} workers"
        return f"the global batch {cfg.global_batch} is larger than the {n} training samples " \
            f"of {name}; {advice}"
    accumulation = f" x {micro} accumulation steps" if micro > 1 else ""
    options = []
    if n // (per_device * micro):
        options.append(f"at most {n // (per_device * micro)} workers at batch {per_device}")
    if n // (size * micro):
        options.append(f"a batch of at most {n // (size * micro)} per device")
    advice = " or ".join(options) or f"at most {n // micro} workers at batch 1"
    return f"{size} worker{'s' if size != 1 else ''} x batch {per_device}{accumulation} need " \
        f"{plan.derived.global_batch} training samples per step; {name} has {n}: use {advice}"


@contextlib.contextmanager
def _no_new_folders_on_error(path: str | None) -> Iterator[None]:
    """Folders made inside ``path`` (torchvision's, by --download) are removed again when the
    check fails, for instance without a network: a refused run leaves nothing behind."""
    if not path:
        yield
        return
    root = Path(os.path.abspath(os.path.expanduser(path)))
    top = root
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    before = {folder for folder, _, _ in os.walk(top)}
    try:
        yield
    except BaseException:
        for folder, _, _ in os.walk(top, topdown=False):
            if folder not in before:
                with contextlib.suppress(OSError):  # not empty: something was fetched, keep it
                    os.rmdir(folder)
        raise


def train(config: TrainConfig | dict[str, Any], teardown: bool = True,
          command_start: float | None = None) -> dict[str, Any]:
    """Train and return the run record (status ok, failed or oom; never raises for a worker).

    Raises :class:`UsageError` for bad input, before anything is written. Without ``out`` the
    record is returned but nothing is kept on disk. Under torchrun or srun, ``teardown=False``
    leaves the process group standing for a process that exits at once (see ``run_worker``).
    ``command_start`` (a ``time.time()`` value) is when the command began, for the record's
    ``timing``: ``parascale train`` passes its process's start; by default, this call.
    """
    called = time.time()
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_dict(config)
    validate(cfg)
    check_run_folder(cfg)
    size = world_size_for(cfg)
    if cfg.gpus is None and cfg.workers is not None and external_launcher() \
            and cfg.workers != size:
        raise UsageError(f"--workers {cfg.workers} does not match the {size} processes started "
                         f"by {external_launcher()}; leave --workers out under a launcher")
    if cfg.max_restarts and external_launcher():
        raise UsageError(f"--max-restarts restarts the workers of parascale's own launch, not "
                         f"{external_launcher()}'s; under torchrun give torchrun --max-restarts "
                         "(parascale continues its restarted workers from the newest checkpoint)")
    derived = preflight(cfg, size)
    if external_launcher():
        return run_worker(cfg, teardown) or {}
    since = ("process start", command_start) if command_start is not None \
        else ("train() call", called)
    said: list[str] = []  # lines said before the log exists, for the log

    def say(line: str) -> None:
        print(line, flush=True)
        said.append(line)

    choice = resume.first_choice(cfg, size, derived["total_steps"], say)
    return _launch_local(cfg, size, derived, since, choice, said)


def _timing(record: dict[str, Any], since: tuple[str, float]) -> dict[str, Any]:
    """The command's own times around the workers' training window (docs/record.md)."""
    timing = record["timing"]  # what rank 0 knew: its first step and training time
    label, start = since
    command = time.time() - start
    startup = timing["first_step_at"] - start
    return {"command_s": command, "startup_s": startup, "training_s": timing["training_s"],
            "finish_s": command - startup - timing["training_s"],
            "first_step_at": timing["first_step_at"], "since": label}


def _launch_local(cfg: TrainConfig, size: int, derived: dict[str, Any],
                  since: tuple[str, float], choice: resume.Choice | None = None,
                  said: list[str] | None = None) -> dict[str, Any]:
    store = open_store(cfg.port)  # a busy --port is refused before anything is written
    return produce(cfg.out, "parascale-run-",
                   lambda folder: _run_job(cfg, size, derived, store, folder, since, choice,
                                           said or []),
                   rec.RECORD_NAME, rec.dumps,
                   companions=(rec.MODEL_NAME, rec.LOG_NAME, rec.TRACES_NAME))


def _open_log(cfg: TrainConfig, folder: Path) -> ConsoleLog | None:
    """The run's console log: beside the checkpoints while the run is unfinished when it keeps
    any (so that it outlasts a failure or an interruption, and a resumed run goes on writing
    it), else in the staging folder; nothing without --out (nothing is kept)."""
    if not cfg.out:
        return None
    if resume.checkpointing(cfg):
        return ConsoleLog(checkpoint.folder_of(cfg.out) / checkpoint.LOG_NAME,
                          fresh=not cfg.resume)
    return ConsoleLog(folder / rec.LOG_NAME, fresh=True)


def _run_job(cfg: TrainConfig, size: int, derived: dict[str, Any], store,
             folder: Path, since: tuple[str, float], choice: resume.Choice | None,
             said: list[str]) -> dict[str, Any]:
    """Run the workers writing into ``folder`` (again from the newest checkpoint after a
    failure, up to --max-restarts times); the record, ``config.out`` as the user gave it."""
    resolved = dataclasses.replace(cfg, workers=size, out=str(folder),
                                   save_model=cfg.save_model and cfg.out is not None)
    log = _open_log(cfg, folder)
    checkpoints = checkpoint.folder_of(cfg.out) if cfg.out else None
    restarts: list[dict[str, Any]] = []

    def next_attempt(attempt: int, failed) -> dict[str, str]:
        chosen = resume.choose(cfg, size, derived["total_steps"], "restart", rank=failed.rank,
                               reason=failed.message) if resume.checkpointing(cfg) else None
        restarts.append({"at": _iso(failed.ended_at), "attempt": attempt, "rank": failed.rank,
                         "reason": failed.message, "from_step": chosen and chosen.step,
                         "checkpoint": chosen and chosen.label})
        print(f"parascale: {failed.message}; restarting every worker from "
              f"{chosen.label if chosen else 'the beginning'} (restart {attempt} of "
              f"{cfg.max_restarts})", flush=True)
        return {RESUME_ENV: chosen.to_env() if chosen else ""}

    env = {"PARASCALE_CONFIG": json.dumps(resolved.to_dict()), **data.handover_env(cfg),
           CHECKPOINTS_ENV: str(checkpoints or ""), LOG_ENV: str(log.path) if log else "",
           RESUME_ENV: choice.to_env() if choice else ""}
    try:
        with log.tee() if log else contextlib.nullcontext():
            if log:
                log.line(f"--- parascale train, local launch of {size} worker(s), "
                         f"{rec.now()} ---")
                for line in said:
                    log.line(line)
            print(f"parascale: starting {size} worker{'s' if size > 1 else ''}...", flush=True)
            outcome = launch("parascale.training.worker", size, env,
                             threads=threads_per_worker(cfg, size), store=store,
                             max_restarts=cfg.max_restarts, restart=next_attempt)
    except BaseException:  # interrupted: the log said so, and stays where it is
        if log:
            log.close()
        raise
    if outcome.status == "ok":
        record = json.loads((folder / rec.RECORD_NAME).read_text())
        record["config"]["out"] = cfg.out
        record["timing"] = _timing(record, since)
        record["restarts"] = restarts
    else:
        (folder / rec.MODEL_NAME).unlink(missing_ok=True)  # saved before the failure: no result
        record = rec.failure_record({**resolved.to_dict(), "out": cfg.out}, outcome.status,
                                    outcome.message, derived, detail=outcome.detail)
        record["restarts"] = restarts
        record["resumed"] = [choice.entry()] if choice else None
    if log:
        ending = {"ok": "finished", "failed": "failed", "oom": "ran out of memory"}
        after = f" after {len(restarts)} restart(s)" if restarts else ""
        log.line(f"parascale: {ending.get(outcome.status, outcome.status)} at {rec.now()}"
                 f"{after}" + ("" if outcome.status == "ok" else f": {outcome.message}"))
        log.close()
        if log.path != folder / rec.LOG_NAME:  # the result set gets the whole log so far
            shutil.copyfile(log.path, folder / rec.LOG_NAME)
    return record


def _iso(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc) \
        .isoformat(timespec="seconds")
