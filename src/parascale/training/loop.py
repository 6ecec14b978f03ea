"""One worker's training run: the same code under parascale's launcher, torchrun or srun.

The step never names a synchronisation algorithm (see :mod:`parascale.sync.base`); metrics are
reduced across ranks before anyone reports them; rank 0 alone prints, shows progress and writes.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from tqdm import tqdm

from parascale import flops, sync, tasks
from parascale.data import DataBundle
from parascale.batch import Plan, make_plan
from parascale.config import TrainConfig, checkpoint_interval
from parascale.record import now
from parascale.runrecord import EpochEntry
from parascale.runtime import World, env, joined, resolve_backend, resolve_device_type
from parascale.runtime.faults import Faults
from parascale.training import checkpoint, console, resume, state
from parascale.training import lr as lr_rule
from parascale.training.assemble import assemble
from parascale.training.board import open_board
from parascale.training.building import build_model
from parascale.training.contention import CpuWatch
from parascale.training.divergence import DivergenceWatch, advice
from parascale.training.epochs import epoch_entry
from parascale.training.evaluate import evaluate
from parascale.training.judging import epoch_line, time_to_target
from parascale.training.keeper import Keeper
from parascale.training.measure import LossTally, StepClock, steady
from parascale.training.memory_split import MemorySplit
from parascale.training.noise import NoiseScale
from parascale.training.profiling import Profiler
from parascale.training.pruning import Judge
from parascale.training.run import Progress, Run, Summary, Times
from parascale.training.sampling import train_shard


def run_worker(cfg: TrainConfig, teardown: bool = True,
               plan: Plan | None = None) -> dict | None:
    """Join the world, train, write the record on rank 0 and return it (None on other ranks).

    ``teardown=False`` for a process that exits right after (see ``runtime.world.joined``).
    ``plan``: the launcher's step plan (``training.preflight``), else this worker makes it.
    """
    device_type = resolve_device_type(cfg.device, cfg.gpus)
    backend = resolve_backend(cfg.backend, device_type)
    with joined(device_type, backend, cfg.gpus, cfg.timeout, teardown) as world:
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


_NOTHING = contextlib.nullcontext()  # reusable: one object for every step, not one per step


def _autocast(cfg: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager:
    if cfg.precision == "fp32":
        return _NOTHING
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def _build_model(cfg: TrainConfig, task: tasks.Task, world: World) -> nn.Module:
    model = build_model(cfg, world, task.model)  # sharded parameters: built without storage
    if cfg.sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.compile:
        return cast(nn.Module, torch.compile(model))  # a module still, wrapping the model
    return model


def _train(cfg: TrainConfig, world: World, plan: Plan | None) -> dict | None:
    started, t_setup = now(), time.perf_counter()
    run = _set_up(cfg, world, plan)
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
        entry, rows = _epoch(run, epoch, progress.epoch_part if epoch == first else None)
        progress.rows[epoch] = rows
        progress.epochs.append(entry)
        if world.is_main:
            print(epoch_line(entry, run.plan, run.task), flush=True)
        if run.board is not None:
            run.board.epoch(entry.to_dict())
        progress.tta = time_to_target(cfg, directions, entry, progress.tta)
        stop = bool(cfg.stop_at_target and progress.tta and progress.tta["reached"])
        if not stop and run.judge is not None and \
                run.judge.stop(entry, last=epoch == run.plan.epochs):
            pruned, stop = epoch, True
            if world.is_main:
                print(f"parascale: the search pruned this trial after epoch {epoch}", flush=True)
        if not stop and run.keeper is not None and \
                run.keeper.due_after_epoch(epoch, progress.step):
            run.keeper.write(run, {"step": progress.step, "epoch": epoch + 1, "done": 0})
        if stop:
            break
    run.profiler.close()
    if run.board is not None:
        run.board.close()
    if world.is_main and (said := run.noise.line()):
        print(said, flush=True)
    run.strategy.finish()
    ended = time.perf_counter()
    times = Times(setup_s=setup_s, total_s=ended - progress.t_start, start=started,
                  training_s=ended - t_attempt, first_step_at=first_step_at)
    search = None if run.judge is None else {"trial": run.judge.number,
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
            "checkpoints": run.keeper.summary() if run.keeper is not None else None,
            "profile": run.profiler.summary(), "noise": run.noise.summary()}


def _set_up(cfg: TrainConfig, world: World, given: Plan | None) -> Run:
    """Threads, data, plan, model, optimizer and watches, ready for the first step: of the run,
    or after the checkpoint it continues from."""
    if world.is_main:  # start-up can take long on a busy machine: say what it is doing
        print(f"parascale: {world.size} worker(s) joined; loading the data and building the "
              "model...", flush=True)
    threads = cfg.threads or int(os.environ.get("OMP_NUM_THREADS") or 0)
    if threads:  # the local launcher sets OMP_NUM_THREADS; under torchrun --threads decides
        torch.set_num_threads(threads)
    faults = Faults.from_env(world.rank)
    device = world.device
    task, bundle = tasks.prepare(cfg)
    kind = sync.strategy_of(cfg)
    pending = kind.resolves_before_training(cfg)  # the plan is known once it is decided
    plan = _plan(cfg, world, bundle, given)
    choice = resume.in_world(cfg, world, None if pending else plan.total_steps)
    saved = checkpoint.load(Path(choice.path)) if choice else None
    original = cfg
    resolved = kind.resolve(cfg, world, bundle, lambda: _build_model(original, task, world),
                            saved["progress"] if saved is not None else None)
    cfg, tuning_s = resolved.cfg, resolved.seconds
    if pending:  # the plan of the setting now decided
        plan = _plan(cfg, world, bundle, None)
    strategy = sync.build(cfg, world)
    strategy.adopt(resolved)
    model = _build_model(cfg, task, world)
    measured = flops.measure(cfg, world, plan.derived.per_device_batch, bundle.train, model,
                             task.loss)
    net = strategy.wrap(model)
    optimizer = strategy.wrap_optimizer(tasks.build_optimizer(task, cfg, net.parameters()))
    scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" and device.type == "cuda" \
        else None
    if world.is_main:
        _banner(cfg, world, plan, bundle, task)
    divergence = DivergenceWatch(world, strategy.exchanges_every_step, lambda at, rate: advice(
        cfg, plan.derived, plan.steps_per_epoch, plan.warmup_steps, at, rate))
    cpu = CpuWatch(world.host, world.local_rank)
    progress = Progress(decided=resolved.decided)
    run = Run(cfg, world, plan, bundle, strategy, net, optimizer, scaler, faults, divergence,
              StepClock(device), cpu, Profiler(cfg, world),
              NoiseScale(cfg, world, strategy, plan, scaler, len(bundle.train)), progress, task,
              tuning_s=tuning_s, judge=Judge.from_env(world), choice=choice, flops=measured,
              memory=MemorySplit(enabled=not cfg.compile),
              board=open_board(cfg.tensorboard, world.is_main))
    folder = resume.checkpoints_of(cfg)
    interval = checkpoint_interval(cfg.checkpoint_every)
    if interval is not None and folder is not None:
        run.keeper = Keeper(interval, folder, cfg.keep, original, world, plan)
    if saved is not None:
        state.continue_run(run, saved, choice)
    cpu.start_window()
    return run


def _plan(cfg: TrainConfig, world: World, bundle: DataBundle, given: Plan | None) -> Plan:
    """The launcher's plan, made once from the data it checked; this worker's own when none
    was handed over (or the strategy resolved a setting since). A handed-over plan must be of
    this world and these data: ranks with different plans would wait on each other forever."""
    if given is None:
        return make_plan(cfg, world.size, len(bundle.train), len(bundle.test),
                         replicas=sync.strategy_of(cfg).replicas_per_device(cfg))
    here = (world.size, len(bundle.train), len(bundle.test))
    if (given.derived.world_size, given.train_samples, given.test_samples) != here:
        raise RuntimeError(f"the launcher planned for {given.derived.world_size} worker(s), "
                           f"{given.train_samples} training and {given.test_samples} test "
                           f"samples; this worker has {here[0]}, {here[1]} and {here[2]}")
    return given


def _epoch(run: Run, epoch: int,
           part: dict | None = None) -> tuple[EpochEntry, list[list[float]]]:
    """One epoch's steps, then its record entry (evaluated when due) and its step-time rows.

    ``part``: what a checkpoint in the middle of this epoch kept (steps done, this rank's loss
    sum, time and step rows, and its augmentation generator): the epoch goes on from there.
    """
    cfg, world, plan, device = run.cfg, run.world, run.plan, run.world.device
    progress = run.progress
    per_device = plan.derived.per_device_batch
    done = int(part["done"]) if part else 0
    count = min(plan.steps_per_epoch, plan.total_steps - (progress.step - done))
    # a bar per epoch, on rank 0's terminal only (never in its log): a long epoch is never silent
    bar = tqdm(total=count, initial=done, unit="step", file=console.terminal(sys.stderr),
               mininterval=0.5, miniters=1, disable=None if world.is_main else True,
               leave=False, desc=f"epoch {epoch}/{plan.epochs}")
    run.cpu.start_epoch()
    shard = train_shard(len(run.bundle.train), per_device, world.size, world.rank, cfg.accumulate,
                        cfg.seed, epoch, count)
    # augmentation randomness differs per rank and epoch, yet is reproducible
    generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + world.rank * 7919 + epoch)
    losses = LossTally(device, part["loss_sum"] if part else None)
    carried_s = 0.0  # this rank's training time in the epoch before the checkpoint
    if part:
        generator.set_state(part["generator"])
        carried_s = float(part["time_s"])
        run.clock.rows = part["rows"].tolist()
        run.noise.restore(part.get("noise"))
    batches = iter(run.bundle.train.batches([mb for s in shard[done:] for mb in s], device,
                                            train=True, generator=generator,
                                            loader_workers=cfg.loader_workers))
    # CPU time beside wall time: on a shared machine the wall clock also counts the time other
    # processes held the cores, the CPU time only this process's own work (every thread's)
    # paused: writing checkpoints, not training
    t_epoch, cpu_epoch, paused = time.perf_counter(), time.process_time(), 0.0
    first_step = progress.step + 1
    rate = run.optimizer.param_groups[0]["lr"]
    for i in range(done, count):
        rate = _step(run, batches, losses)
        bar.update()
        if run.keeper is not None and i + 1 < count and run.keeper.due_after_step(progress.step):
            run.clock.flush()
            mine = {"done": i + 1, "loss_sum": losses.total(),
                    "time_s": carried_s + time.perf_counter() - t_epoch - paused,
                    "rows": torch.tensor(run.clock.rows, dtype=torch.float64).reshape(-1, 5),
                    "noise": run.noise.part()}
            paused += run.keeper.write(run, {"step": progress.step, "epoch": epoch,
                                             "done": i + 1}, mine, generator)
    run.divergence.settle(final=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    epoch_time = carried_s + time.perf_counter() - t_epoch - paused
    # a resumed epoch's CPU time before the checkpoint is not kept: its entry is a warm-up one
    cpu_time = time.process_time() - cpu_epoch
    bar.close()
    run.clock.flush()
    rows = run.clock.restart()
    entry = epoch_entry(epoch, count, plan, (epoch_time, cpu_time), losses.total(), world,
                        rate, run.cpu.end_epoch(), epoch in progress.warm, rows,
                        run.task.throughput_unit())
    entry.noise = run.noise.end_epoch(epoch)
    # slowed by the profiler: left out of the steady figures
    entry.profiled = run.profiler.covers(first_step, progress.step)
    # its time spans a restart: a warm-up epoch again
    entry.resumed = bool(part or (progress.resumed and epoch == progress.position["epoch"]))
    if epoch % cfg.eval_every == 0 or epoch == plan.epochs:
        run.strategy.before_evaluation()
        # --val-fraction: the validation split, what a search may look at
        for name, split in (("test", run.bundle.test if cfg.evaluate_test else None),
                            ("val", run.bundle.val)):
            if split is not None:  # a metric's key is <split>_<name>: test_accuracy, val_loss
                entry.metrics.update({f"{name}_{metric}": value for metric, value in evaluate(
                    run.task, run.strategy.local_module(), split, world, max(per_device, 256),
                    lambda: _autocast(cfg, device), run.strategy.evaluates_in_lockstep).items()})
    entry.elapsed_s = time.perf_counter() - progress.t_start
    return entry, rows


def _step(run: Run, batches, losses: LossTally) -> float:
    """One optimizer step over ``accumulate`` micro-batches, timed by phase; its rate."""
    cfg, plan, clock, strategy, optimizer = run.cfg, run.plan, run.clock, run.strategy, \
        run.optimizer
    accumulate = cfg.accumulate
    run.progress.step += 1
    step = run.progress.step
    run.faults.before_step(step, plan.derived.per_device_batch)
    rate = lr_rule.lr_at(step - 1, base_lr=cfg.lr, effective_lr=plan.derived.effective_lr,
                         warmup_steps=plan.warmup_steps, total_steps=plan.total_steps,
                         schedule=cfg.lr_schedule, steps_per_epoch=plan.steps_per_epoch,
                         milestones=cfg.lr_milestones, gamma=cfg.lr_gamma,
                         from_zero=cfg.warmup_steps > 0, lr_min=cfg.lr_min)
    for group in optimizer.param_groups:
        group["lr"] = rate
    prof = run.profiler
    prof.step_begins(step)
    clock.start()
    with prof.phase("data"):
        micro = [next(batches) for _ in range(accumulate)]
    clock.mark()
    with prof.phase("compute"):
        step_loss: torch.Tensor | None = None  # the step's loss, over its micro-batches
        for m, batch in enumerate(micro):
            with strategy.accumulating(last=m == accumulate - 1), \
                    _autocast(cfg, run.world.device), run.memory.forward():
                loss = run.faults.loss(step, run.task.loss(run.net, batch))
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
            if m == accumulate - 1:
                run.divergence.observe(step, step_loss, rate)  # an all-reduce overlapping
            scaled = loss / accumulate if accumulate > 1 else loss  # x / 1: the same, one op less
            (run.scaler.scale(scaled) if run.scaler else scaled).backward()
            losses.add(loss, tasks.samples_in(batch))
    clock.boundary(strategy.compute_end())
    with prof.phase("sync"):
        strategy.synchronize(optimizer)
    clock.boundary()
    with prof.phase("optimizer"):
        run.noise.observe()  # the averaged gradient, before the optimizer uses it
        if cfg.clip_grad_norm is not None:  # the averaged gradient, as one device's would be
            if run.scaler is not None:
                run.scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(run.net.parameters(), cfg.clip_grad_norm)
        strategy.step(optimizer, run.scaler)
        run.memory.after_step(run.net, optimizer)  # once: the held bytes by category
        optimizer.zero_grad(set_to_none=True)
    clock.boundary()
    with prof.phase("sync"):
        strategy.after_step(step)
        run.divergence.settle()  # decides the step before: its wait, if any, counts as sync
    clock.stop()
    prof.step_ends(step)
    return rate


def _banner(cfg: TrainConfig, world: World, plan: Plan, bundle, task: tasks.Task) -> None:
    d = plan.derived
    threads = torch.get_num_threads()
    rule = "" if cfg.lr_scaling == "none" else \
        f" ({cfg.lr_scaling} scaling from base batch {d.base_batch})"
    warm = f", warm-up {cfg.warmup_epochs:g} epochs" if cfg.warmup_epochs else ""
    accumulate = f" x {cfg.accumulate} accumulation steps" if cfg.accumulate > 1 else ""
    print(f"parascale: {task.name}, {world.size} worker(s) on "
          f"{world.device.type} ({world.backend}, {world.launcher} launch, {threads} thread(s) "
          f"per worker), sync {cfg.sync}", flush=True)
    print(f"  batch {d.per_device_batch} per device x {world.size} workers{accumulate} = "
          f"{d.global_batch} global; lr {cfg.lr:g} -> {d.effective_lr:g}{rule}{warm}", flush=True)
    held = f"{len(bundle.val)} validation samples" if bundle.val is not None else ""
    evaluated = f"{len(bundle.test)} test samples" + (f", {held}" if held else "") \
        if cfg.evaluate_test else f"{held} (the test set is not evaluated)"
    print(f"  {plan.total_steps} steps: {plan.epochs} epoch(s) of {plan.steps_per_epoch} steps "
          f"over {len(bundle.train)} training samples; {evaluated}", flush=True)
