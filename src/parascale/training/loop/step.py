"""One epoch's steps and one optimizer step: timed by phase, checked, checkpointed when due,
and the epoch's record entry (evaluated when due) at its end."""
from __future__ import annotations

import contextlib
import sys
import time

import torch
from torch import nn
from tqdm import tqdm

from parascale import tasks
from parascale.runrecord import EpochEntry
from parascale.training.loop import lr as lr_rule
from parascale.training.loop.evaluate import evaluate_epoch
from parascale.training.loop.run import Run
from parascale.training.loop.sampling import train_shard
from parascale.training.observe import console
from parascale.training.observe.measure import LossTally
from parascale.training.record.epochs import epoch_entry


_NOTHING = contextlib.nullcontext()  # reusable: one object for every step, not one per step
_AUTOCASTS: dict[tuple[str, str], torch.autocast] = {}  # the same: entered one at a time


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return _NOTHING
    key = (device.type, precision)
    if key not in _AUTOCASTS:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        _AUTOCASTS[key] = torch.autocast(device.type, dtype=dtype)
    return _AUTOCASTS[key]


def run_epoch(run: Run, epoch: int,
               part: dict | None = None) -> tuple[EpochEntry, list[list[float]]]:
    """One epoch's steps, then its record entry (evaluated when due) and its step-time rows.

    ``part``: what a checkpoint in the middle of this epoch kept (steps done, this rank's loss
    sum, time and step rows, and its augmentation generator): the epoch goes on from there.
    """
    cfg, world, plan, device = run.cfg, run.world, run.plan, run.world.device
    progress, clock = run.progress, run.phases.clock
    per_device = plan.derived.per_device_batch
    done = int(part["done"]) if part else 0
    count = min(plan.steps_per_epoch, plan.total_steps - (progress.step - done))
    # a bar per epoch, on rank 0's terminal only (never in its log): a long epoch is never silent
    bar = tqdm(total=count, initial=done, unit="step", file=console.terminal(sys.stderr),
               mininterval=0.5, miniters=1, disable=None if world.is_main else True,
               leave=False, desc=f"epoch {epoch}/{plan.epochs}")
    run.cpu.start_epoch()
    shard = train_shard(len(run.bundle.train), per_device, world.size, world.rank,
                        cfg.batch.accumulate, cfg.job.seed, epoch, count)
    # augmentation randomness differs per rank and epoch, yet is reproducible
    generator = torch.Generator().manual_seed(cfg.job.seed * 1_000_003 + world.rank * 7919 + epoch)
    losses = LossTally(device, part["loss_sum"] if part else None)
    carried_s = 0.0  # this rank's training time in the epoch before the checkpoint
    if part:
        generator.set_state(part["generator"])
        carried_s = float(part["time_s"])
        clock.rows = part["rows"].tolist()
        run.noise.restore(part.get("noise"))
    batches = iter(run.bundle.train.batches([mb for s in shard[done:] for mb in s], device,
                                            train=True, generator=generator,
                                            loader_workers=cfg.data.loader_workers))
    # CPU time beside wall time: on a shared machine the wall clock also counts the time other
    # processes held the cores, the CPU time only this process's own work (every thread's)
    # paused: writing checkpoints, not training
    t_epoch, cpu_epoch, paused = time.perf_counter(), time.process_time(), 0.0
    first_step = progress.step + 1
    rate = run.optimizer.param_groups[0]["lr"]
    for i in range(done, count):
        rate = take_step(run, batches, losses)
        bar.update()
        if run.checkpoints is not None and i + 1 < count and \
                run.checkpoints.due_after_step(progress.step):
            clock.flush()
            mine = {"done": i + 1, "loss_sum": losses.total(),
                    "time_s": carried_s + time.perf_counter() - t_epoch - paused,
                    "rows": torch.tensor(clock.rows, dtype=torch.float64).reshape(-1, 5),
                    "noise": run.noise.part()}
            paused += run.checkpoints.write(run, {"step": progress.step, "epoch": epoch,
                                             "done": i + 1}, mine, generator)
    run.divergence.settle(final=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    epoch_time = carried_s + time.perf_counter() - t_epoch - paused
    # a resumed epoch's CPU time before the checkpoint is not kept: its entry is a warm-up one
    cpu_time = time.process_time() - cpu_epoch
    bar.close()
    clock.flush()
    rows = clock.restart()
    entry = epoch_entry(epoch, count, plan, (epoch_time, cpu_time), losses.total(), world,
                        rate, run.cpu.end_epoch(), epoch in progress.warm, rows,
                        run.task.throughput_unit())
    entry.noise = run.noise.end_epoch(epoch)
    # slowed by the profiler: left out of the steady figures
    entry.profiled = run.phases.profiler.covers(first_step, progress.step)
    # its time spans a restart: a warm-up epoch again
    entry.resumed = bool(part or (progress.resumed and epoch == progress.position["epoch"]))
    if epoch % cfg.evaluation.eval_every == 0 or epoch == plan.epochs:
        evaluate_epoch(run, entry, lambda: _autocast(cfg.strategy.precision, device))
    entry.elapsed_s = time.perf_counter() - progress.t_start
    return entry, rows


def take_step(run: Run, batches, losses: LossTally) -> float:
    """One optimizer step over ``accumulate`` micro-batches, timed by phase; its rate."""
    cfg, plan, phases, strategy, optimizer = run.cfg, run.plan, run.phases, run.strategy, \
        run.optimizer
    optim, precision, accumulate = cfg.optim, cfg.strategy.precision, cfg.batch.accumulate
    run.progress.step += 1
    step = run.progress.step
    run.faults.before_step(step, plan.derived.per_device_batch)
    rate = lr_rule.lr_at(step - 1, optim, effective_lr=plan.derived.effective_lr,
                         warmup_steps=plan.warmup_steps, total_steps=plan.total_steps,
                         steps_per_epoch=plan.steps_per_epoch)
    for group in optimizer.param_groups:
        group["lr"] = rate
    phases.begin(step)
    with phases.data:
        micro = [next(batches) for _ in range(accumulate)]
    with phases.compute:
        step_loss: torch.Tensor | None = None  # the step's loss, over its micro-batches
        for m, batch in enumerate(micro):
            with strategy.accumulating(last=m == accumulate - 1), \
                    _autocast(precision, run.world.device), run.memory.forward():
                loss = run.faults.loss(step, run.task.loss(run.net, batch))
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
            if m == accumulate - 1:
                run.divergence.observe(step, step_loss, rate)  # an all-reduce overlapping
            scaled = loss / accumulate if accumulate > 1 else loss  # x / 1: the same, one op less
            (run.scaler.scale(scaled) if run.scaler else scaled).backward()
            losses.add(loss, tasks.samples_in(batch))
    with phases.sync:  # compute ended where the strategy says: DDP's last bucket was ready
        strategy.synchronize(optimizer)
    with phases.optimizer:
        run.noise.observe()  # the averaged gradient, before the optimizer uses it
        if optim.clip_grad_norm is not None:  # the averaged gradient, as one device's would be
            if run.scaler is not None:
                run.scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(run.net.parameters(), optim.clip_grad_norm)
        strategy.step(optimizer, run.scaler)
        run.memory.after_step(run.net, optimizer)  # once: the held bytes by category
        optimizer.zero_grad(set_to_none=True)
    with phases.after:
        strategy.after_step(step)
        run.divergence.settle()  # decides the step before: its wait, if any, counts as sync
    phases.end(step)
    return rate
