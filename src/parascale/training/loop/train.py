"""One worker's training run: the same code under parascale's launcher, torchrun or srun.

The step never names a synchronisation algorithm (see :mod:`parascale.sync.base`); metrics are
reduced across ranks before anyone reports them; rank 0 alone prints, shows progress and writes.
"""
from __future__ import annotations

import time
from typing import Any

from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.record import now
from parascale.runtime import World, env, joined, resolve_backend, resolve_device_type
from parascale.training.loop.lines import epoch_line
from parascale.training.loop.run import Run
from parascale.training.loop.setup import set_up
from parascale.training.loop.step import run_epoch
from parascale.training.observe import console
from parascale.training.record.assemble import assemble
from parascale.training.record.summary import Summary, Times, steady
from parascale.training.record.target import time_to_target


def run_worker(cfg: TrainConfig, teardown: bool = True,
               plan: Plan | None = None) -> dict | None:
    """Join the world, train, write the record on rank 0 and return it (None on other ranks).

    ``teardown=False`` for a process that exits right after (see ``runtime.world.joined``).
    ``plan``: the launcher's step plan (``training.launch.preflight``), else this worker makes it.
    """
    processes = cfg.processes
    device_type = resolve_device_type(processes.device, processes.gpus)
    backend = resolve_backend(processes.backend, device_type)
    with joined(device_type, backend, processes.gpus, processes.timeout, teardown) as world:
        log = console.worker_log(cfg, world)
        if log is None:
            return _train(cfg, world, plan)
        try:
            with log.tee():
                record = _train(cfg, world, plan)
            if world.launcher != "local":  # the local launcher says how its job ended
                log.line(f"parascale: finished at {now()}")
            return record
        finally:
            log.close()


def _train(cfg: TrainConfig, world: World, plan: Plan | None) -> dict | None:
    started, t_setup = now(), time.perf_counter()
    run = set_up(cfg, world, plan)
    try:
        return _train_set_up(cfg, world, run, started, t_setup)
    except RuntimeError as error:
        # a broken exchange is often the echo of a helper process's death (a killed parameter
        # server): the strategy names that death rather than the peer that saw it first
        cause = run.strategy.explain(error)
        if cause is error:
            raise
        raise cause from error


def _train_set_up(cfg: TrainConfig, world: World, run: Run, started: str,
                  t_setup: float) -> dict | None:
    progress = run.progress
    # the strategy's decisions took training steps: they count towards time-to-accuracy
    setup_s = time.perf_counter() - t_setup - run.tuning_s
    t_attempt, first_step_at = time.perf_counter() - run.tuning_s, time.time() - run.tuning_s
    progress.t_start = t_attempt - progress.elapsed_before  # elapsed_s goes on from the checkpoint
    pruned = None
    first = progress.position["epoch"]
    directions = run.task.directions()
    for epoch in range(first, run.plan.epochs + 1):
        entry, rows = run_epoch(run, epoch, progress.epoch_part if epoch == first else None)
        progress.rows[epoch] = rows
        progress.epochs.append(entry)
        if world.is_main:
            print(epoch_line(entry, run.plan, run.task), flush=True)
        if run.tensorboard is not None:
            run.tensorboard.epoch(entry.to_dict())
        progress.tta = time_to_target(cfg.evaluation, directions, entry, progress.tta)
        stop = bool(cfg.evaluation.stop_at_target and progress.tta and progress.tta["reached"])
        if not stop and run.pruner is not None and \
                run.pruner.stop(entry, last=epoch == run.plan.epochs):
            pruned, stop = epoch, True
            if world.is_main:
                print(f"parascale: the search pruned this trial after epoch {epoch}", flush=True)
        if not stop and run.checkpoints is not None and \
                run.checkpoints.due_after_epoch(epoch, progress.step):
            run.checkpoints.write(run, {"step": progress.step, "epoch": epoch + 1, "done": 0})
        if stop:
            break
    run.phases.profiler.close()
    if run.tensorboard is not None:
        run.tensorboard.close()
    if world.is_main and (said := run.noise.line()):
        print(said, flush=True)
    run.strategy.finish()
    ended = time.perf_counter()
    times = Times(setup_s=setup_s, total_s=ended - progress.t_start, start=started,
                  training_s=ended - t_attempt, first_step_at=first_step_at)
    search = None if run.pruner is None else {"trial": run.pruner.number,
                                             "pruned_at_epoch": pruned}
    kept = steady(progress, run.plan.steps_per_epoch, run.plan.epochs)
    return assemble(cfg, world, run.plan, run.strategy, Summary(
        progress.epochs, kept, progress.tta, times, run.cpu.end_window(), search,
        _continuity(run, started), task=run.task.section(), flops=run.flops), memory=run.memory)


def _continuity(run: Run, started: str) -> dict[str, Any]:
    """The record's ``resumed``, ``restarts`` and ``checkpoints`` (the local launcher replaces
    ``restarts`` with its own list; under torchrun only the current restart is known)."""
    restarts = []
    if run.world.launcher != "local" and env.attempt() > 0:
        restarts.append({"at": started, "attempt": env.attempt(), "rank": None,
                         "reason": f"{run.world.launcher} started the workers again (attempt "
                                   f"{env.attempt()}); it does not say which rank failed, or why",
                         "from_step": run.choice.step if run.choice else None})
    return {"resumed": run.progress.resumed or None, "restarts": restarts,
            "checkpoints": run.checkpoints.summary() if run.checkpoints is not None else None,
            "profile": run.phases.profiler.summary(), "noise": run.noise.summary()}
