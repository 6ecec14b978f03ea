"""A worker's run assembled before its first step: threads, data, the step plan, the strategy
and what it decided, the model, optimizer and watches, and (when the run continues) the state
of the checkpoint it continues from. The loop (:mod:`.train`) only runs what this builds."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from parascale import flops, sync, tasks
from parascale.batch import Plan, make_plan
from parascale.config import TrainConfig, checkpoint_interval
from parascale.data import DataBundle
from parascale.runtime import World, env
from parascale.runtime.faults import Faults
from parascale.training.checkpoint import disk as checkpoint
from parascale.training.checkpoint import resume, state
from parascale.training.checkpoint.resume import Choice
from parascale.training.checkpoint.writer import CheckpointWriter
from parascale.training.loop import building
from parascale.training.loop.lines import banner
from parascale.training.loop.pruning import TrialPruner
from parascale.training.loop.run import Run
from parascale.training.observe.contention import CpuWatch
from parascale.training.observe.divergence import DivergenceWatch, advice
from parascale.training.observe.measure import StepClock
from parascale.training.observe.memory_split import MemorySplit
from parascale.training.observe.noise import NoiseScale
from parascale.training.observe.phases import StepPhases
from parascale.training.observe.profiling import Profiler
from parascale.training.observe.tensorboard import open_tensorboard
from parascale.training.record.progress import Progress


def build_model(cfg: TrainConfig, task: tasks.Task, world: World) -> nn.Module:
    model = building.build_model(cfg, world, task.model)  # sharded parameters: without storage
    if cfg.strategy.sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.strategy.compile:
        return cast(nn.Module, torch.compile(model))  # a module still, wrapping the model
    return model


def set_up(cfg: TrainConfig, world: World, given: Plan | None) -> Run:
    """Threads, data, plan, model, optimizer and watches, ready for the first step: of the run,
    or after the checkpoint it continues from."""
    if world.is_main:  # start-up can take long on a busy machine: say what it is doing
        print(f"parascale: {world.size} worker(s) joined; loading the data and building the "
              "model...", flush=True)
    threads = cfg.processes.threads or int(os.environ.get("OMP_NUM_THREADS") or 0)
    if threads:  # the local launcher sets OMP_NUM_THREADS; under torchrun --threads decides
        torch.set_num_threads(threads)
    faults = Faults.from_env(world.rank)
    device = world.device
    task, bundle = tasks.prepare(cfg)
    kind = sync.strategy_of(cfg)
    pending = kind.resolves_before_training(cfg)  # the plan is known once it is decided
    plan = plan_for(cfg, world, bundle, given)
    choice = resume.in_world(cfg, world, None if pending else plan.total_steps)
    # the checkpoint this attempt continues from, and what it holds
    resumed = (choice, checkpoint.load(Path(choice.path))) if choice is not None else None
    original = cfg
    resolved = kind.resolve(cfg, world, bundle, lambda: build_model(original, task, world),
                            resumed[1]["progress"] if resumed is not None else None)
    cfg, tuning_s = resolved.cfg, resolved.seconds
    if pending:  # the plan of the setting now decided
        plan = plan_for(cfg, world, bundle, None)
    strategy = sync.build(cfg, world)
    strategy.adopt(resolved)
    model = build_model(cfg, task, world)
    measured = flops.measure(cfg, world, plan.derived.per_device_batch, bundle.train, model,
                             task.loss)
    net = strategy.wrap(model)
    optimizer = strategy.wrap_optimizer(tasks.build_optimizer(task, cfg.optim, net.parameters()))
    scaler = torch.amp.GradScaler("cuda") \
        if cfg.strategy.precision == "fp16" and device.type == "cuda" else None
    if world.is_main:
        banner(cfg, world, plan, bundle, task)
    divergence = DivergenceWatch(world, strategy.exchanges_every_step, lambda at, rate: advice(
        cfg, plan.derived, plan.steps_per_epoch, plan.warmup_steps, at, rate))
    cpu = CpuWatch(world.host, world.local_rank)
    progress = Progress(decided=resolved.decided)
    folder = resume.checkpoints_of(cfg)  # the user's --out/checkpoints
    phases = StepPhases(StepClock(device), Profiler(cfg, world, folder.parent if folder else None),
                        strategy.compute_end)
    run = Run(cfg, world, plan, bundle, strategy, net, optimizer, scaler, faults, divergence,
              phases, cpu,
              NoiseScale(cfg, world, strategy, plan, scaler, len(bundle.train)), progress, task,
              tuning_s=tuning_s, pruner=TrialPruner.from_env(world), choice=choice,
              flops=measured, memory=MemorySplit(enabled=not cfg.strategy.compile),
              tensorboard=open_tensorboard(cfg.output.tensorboard, world.is_main))
    interval = checkpoint_interval(cfg.checkpoint.checkpoint_every)
    if interval is not None and folder is not None:
        run.checkpoints = CheckpointWriter(interval, folder, cfg.checkpoint.keep, original, world,
                                           plan)
    if resumed is not None:
        _continue(run, *resumed)
    cpu.start_window()
    return run


def plan_for(cfg: TrainConfig, world: World, bundle: DataBundle, given: Plan | None) -> Plan:
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


def _continue(run: Run, choice: Choice, saved: dict[str, Any]) -> None:
    """Take the run up where checkpoint ``saved`` left it: state (collective, see
    :func:`~parascale.training.checkpoint.state.restore`), position, what the record needs,
    and one line on rank 0."""
    mine = state.restore(run, saved, Path(choice.path))
    progress, position = run.progress, saved["position"]
    progress.load_state_dict(saved["progress"], run.task.throughput_unit())
    progress.position, progress.step = dict(position), int(position["step"])
    progress.warm.add(int(position["epoch"]))  # a new process warms up
    progress.resumed.append(choice.entry())
    if mine["epoch_part"] is not None:
        progress.epoch_part = {**mine["epoch_part"], "generator": mine["rng"]["epoch"]}
    if run.world.is_main:
        where = (f"in epoch {position['epoch']} after its step {position['done']}"
                 if position["done"] else f"at the start of epoch {position['epoch']}"
                 if progress.step < run.plan.total_steps else "after the last step")
        how = {"resume": "--resume", "restart": f"restart {env.attempt()}",
               "torchrun": f"torchrun's restart {env.attempt()}"}.get(choice.by, choice.by)
        print(f"parascale: continuing from {choice.label} ({how}): step {progress.step} of "
              f"{run.plan.total_steps}, {where}", flush=True)
