"""One worker's training run: the same code under parascale's launcher, torchrun or srun.

The step never names a synchronisation algorithm (see :mod:`parascale.sync.base`); metrics are
reduced across ranks before anyone reports them; rank 0 alone prints, shows progress and writes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from parascale import data, models, sync
from parascale.batch import Plan, make_plan
from parascale.config import TrainConfig, checkpoint_interval
from parascale.hpo.judge import Judge
from parascale.record import now
from parascale.runtime import World, joined, resolve_backend, resolve_device_type
from parascale.runtime import env
from parascale.runtime.faults import Faults
from parascale.training import checkpoint, console, resume, state
from parascale.training import lr as lr_rule
from parascale.training.assemble import assemble
from parascale.training.contention import CpuWatch, epoch_load
from parascale.training.divergence import DivergenceWatch, advice
from parascale.training.evaluate import evaluate
from parascale.training.keeper import Keeper
from parascale.training.measure import StepClock, epochs_named
from parascale.training.noise import NoiseScale
from parascale.training.profiling import Profiler
from parascale.training.sampling import train_shard


def run_worker(cfg: TrainConfig, teardown: bool = True) -> dict | None:
    """Join the world, train, write the record on rank 0 and return it (None on other ranks).

    ``teardown=False`` for a process that exits right after (see ``runtime.world.joined``).
    """
    device_type = resolve_device_type(cfg.device, cfg.gpus)
    backend = resolve_backend(cfg.backend, device_type)
    with joined(device_type, backend, cfg.gpus, cfg.timeout, teardown) as world:
        log = console.worker_log(cfg, world)
        if log is None:
            return _train(cfg, world)
        try:
            with log.tee():
                record = _train(cfg, world)
            if world.launcher != "local":  # the local launcher says how its job ended
                log.line(f"parascale: finished at {now()}")
            return record
        finally:
            log.close()


def _autocast(cfg: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager:
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def _build_model(cfg: TrainConfig, bundle, device: torch.device) -> nn.Module:
    torch.manual_seed(cfg.seed)  # identical initial parameters on every rank
    model = models.build(cfg.model, bundle.num_classes, bundle.input_shape).to(device)
    if cfg.sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.compile:
        model = torch.compile(model)
    return model


@dataclass
class _Run:
    """What one worker's training needs from set-up to summary, and the steps taken so far."""

    cfg: TrainConfig
    world: World
    plan: Plan
    bundle: Any
    strategy: Any
    net: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any
    faults: Faults
    divergence: DivergenceWatch
    clock: StepClock
    cpu: CpuWatch
    loss_fn: nn.Module = field(default_factory=nn.CrossEntropyLoss)
    step: int = 0
    tuning_s: float = 0.0  # --learners auto's trial steps, before the first epoch
    judge: Any = None  # a hyperparameter search's pruner (parascale.hpo.judge), in a trial
    keeper: Keeper | None = None  # writes checkpoints when due (--checkpoint-every)
    epochs: list[dict] = field(default_factory=list)  # the record's entries so far
    tta: dict | None = None
    rows: dict[int, list[list[float]]] = field(default_factory=dict)  # step rows per epoch
    warm: set[int] = field(default_factory=lambda: {1})  # warm-up epochs: 1, each resume's
    t_start: float = 0.0  # perf_counter at step 0 of the run (earlier attempts' time included)
    elapsed_before: float = 0.0  # training time before the checkpoint this attempt resumed
    position: dict[str, int] = field(default_factory=lambda: {"step": 0, "epoch": 1, "done": 0})
    epoch_part: dict | None = None  # the resumed epoch's measurements before the checkpoint
    resumed: list[dict] = field(default_factory=list)  # every resume of the run, oldest first
    choice: resume.Choice | None = None
    learners: int | None = None  # SMA's count, resolved (auto is tuned once per run)
    profiler: Profiler | None = None  # --profile: traces of a window of steps
    noise: NoiseScale | None = None  # the gradient noise scale, measured every step

    def progress(self) -> dict[str, Any]:
        """What the record needs from before a checkpoint (see training/state.py)."""
        return {"epochs": [dict(e) for e in self.epochs], "tta": self.tta,
                "elapsed_s": time.perf_counter() - self.t_start, "warm": sorted(self.warm),
                "resumed": [dict(r) for r in self.resumed], "learners": self.learners}


def _train(cfg: TrainConfig, world: World) -> dict | None:
    started, t_setup = now(), time.perf_counter()
    run = _set_up(cfg, world)
    # the tuner's steps were training time: they count towards time-to-accuracy
    setup_s = time.perf_counter() - t_setup - run.tuning_s
    t_attempt, first_step_at = time.perf_counter() - run.tuning_s, time.time() - run.tuning_s
    run.t_start = t_attempt - run.elapsed_before  # elapsed_s goes on from the checkpoint's
    pruned = None
    first = run.position["epoch"]
    for epoch in range(first, run.plan.epochs + 1):
        entry, rows = _epoch(run, epoch, run.epoch_part if epoch == first else None)
        run.rows[epoch] = rows
        run.epochs.append(entry)
        if world.is_main:
            print(_epoch_line(entry, run.plan), flush=True)
        run.tta = _time_to_accuracy(cfg, entry, run.tta)
        stop = bool(cfg.stop_at_target and run.tta and run.tta["reached"])
        if not stop and run.judge is not None and run.judge.stop(entry):
            pruned, stop = epoch, True
            if world.is_main:
                print(f"parascale: the search pruned this trial after epoch {epoch}", flush=True)
        if not stop and run.keeper is not None and run.keeper.due_after_epoch(epoch, run.step):
            run.keeper.write(run, {"step": run.step, "epoch": epoch + 1, "done": 0})
        if stop:
            break
    run.profiler.close()
    if world.is_main and (said := run.noise.line()):
        print(said, flush=True)
    run.strategy.finish()
    ended = time.perf_counter()
    window = run.cpu.end_window()
    return assemble(cfg, world, run.plan, run.strategy, run.epochs, _steady(run), run.tta,
                    {"setup_s": setup_s, "total_s": ended - run.t_start, "start": started,
                     "training_s": ended - t_attempt, "first_step_at": first_step_at}, window,
                    None if run.judge is None else {"trial": run.judge.number,
                                                    "pruned_at_epoch": pruned},
                    _continuity(run, started))


def _continuity(run: _Run, started: str) -> dict[str, Any]:
    """The record's ``resumed``, ``restarts`` and ``checkpoints`` (the local launcher replaces
    ``restarts`` with its own list; under torchrun only the current restart is known)."""
    restarts = []
    if run.world.launcher != "local" and env.attempt() > 0:
        restarts.append({"at": started, "attempt": env.attempt(), "rank": None,
                         "reason": f"{run.world.launcher} started the workers again (attempt "
                                   f"{env.attempt()}); it does not say which rank failed, or why",
                         "from_step": run.choice.step if run.choice else None})
    return {"resumed": run.resumed or None, "restarts": restarts,
            "checkpoints": run.keeper.summary() if run.keeper is not None else None,
            "profile": run.profiler.summary(), "noise": run.noise.summary()}


def _set_up(cfg: TrainConfig, world: World) -> _Run:
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
    bundle = data.build(cfg)
    auto = cfg.sync == "sma" and cfg.learners == "auto"
    choice = resume.in_world(cfg, world, None if auto else
                             make_plan(cfg, world.size, len(bundle.train), len(bundle.test)
                                       ).total_steps)
    saved = checkpoint.load(choice.path) if choice else None
    original = cfg
    tuning, tuning_s = [], 0.0
    if auto and saved is not None:  # tuned once per run: the checkpoint knows the count
        cfg = dataclasses.replace(cfg, learners=saved["progress"]["learners"])
    elif auto:  # decided on real steps, before training
        from parascale.sync import sma_tune

        count, tuning, tuning_s = sma_tune.tune(cfg, world, bundle,
                                                lambda: _build_model(cfg, bundle, device))
        cfg = dataclasses.replace(cfg, learners=count)
    plan = make_plan(cfg, world.size, len(bundle.train), len(bundle.test))
    strategy = sync.build(cfg, world)
    if tuning:
        strategy.tuning = tuning
    net = strategy.wrap(_build_model(cfg, bundle, device))
    optimizer = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay)
    scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" and device.type == "cuda" \
        else None
    if world.is_main:
        _banner(cfg, world, plan, bundle)
    divergence = DivergenceWatch(world, strategy.exchanges_every_step, lambda at, rate: advice(
        cfg, plan.derived, plan.steps_per_epoch, plan.warmup_steps, at, rate))
    cpu = CpuWatch(world.host, world.local_rank)
    run = _Run(cfg, world, plan, bundle, strategy, net, optimizer, scaler, faults, divergence,
               StepClock(device), cpu, tuning_s=tuning_s, judge=Judge.from_env(world),
               choice=choice,
               learners=cfg.learners if isinstance(cfg.learners, int) else None,
               profiler=Profiler(cfg, world),
               noise=NoiseScale(cfg, world, strategy, plan, scaler, len(bundle.train)))
    folder = resume.checkpoints_of(cfg)
    interval = checkpoint_interval(cfg.checkpoint_every)
    if interval is not None and folder is not None:
        run.keeper = Keeper(interval, folder, cfg.keep, original, world, plan)
    if saved is not None:
        state.continue_run(run, saved, choice)
    cpu.start_window()
    return run


def _epoch(run: _Run, epoch: int, part: dict | None = None) -> tuple[dict, list[list[float]]]:
    """One epoch's steps, then its record entry (evaluated when due) and its step-time rows.

    ``part``: what a checkpoint in the middle of this epoch kept (steps done, this rank's loss
    sum, time and step rows, and its augmentation generator): the epoch goes on from there.
    """
    cfg, world, plan, device = run.cfg, run.world, run.plan, run.world.device
    per_device = plan.derived.per_device_batch
    done = int(part["done"]) if part else 0
    count = min(plan.steps_per_epoch, plan.total_steps - (run.step - done))
    # a bar per epoch, on rank 0's terminal only (never in its log): a long epoch is never silent
    progress = tqdm(total=count, initial=done, unit="step", file=console.terminal(sys.stderr),
                    mininterval=0.5, miniters=1, disable=None if world.is_main else True,
                    leave=False, desc=f"epoch {epoch}/{plan.epochs}")
    run.cpu.start_epoch()
    shard = train_shard(len(run.bundle.train), per_device, world.size, world.rank, cfg.accumulate,
                        cfg.seed, epoch, count)
    # augmentation randomness differs per rank and epoch, yet is reproducible
    generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + world.rank * 7919 + epoch)
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    carried_s = 0.0  # this rank's training time in the epoch before the checkpoint
    if part:
        generator.set_state(part["generator"])
        loss_sum += part["loss_sum"].to(device)
        carried_s = float(part["time_s"])
        run.clock.rows = part["rows"].tolist()
        run.noise.restore(part.get("noise"))
    batches = iter(run.bundle.train.batches([mb for s in shard[done:] for mb in s], device,
                                            train=True, generator=generator,
                                            loader_workers=cfg.loader_workers))
    t_epoch, paused = time.perf_counter(), 0.0  # paused: writing checkpoints, not training
    first_step = run.step + 1
    rate = run.optimizer.param_groups[0]["lr"]
    for i in range(done, count):
        rate = _step(run, batches, loss_sum)
        progress.update()
        if run.keeper is not None and i + 1 < count and run.keeper.due_after_step(run.step):
            run.clock.flush()
            mine = {"done": i + 1, "loss_sum": loss_sum,
                    "time_s": carried_s + time.perf_counter() - t_epoch - paused,
                    "rows": torch.tensor(run.clock.rows, dtype=torch.float64).reshape(-1, 5),
                    "noise": run.noise.part()}
            paused += run.keeper.write(run, {"step": run.step, "epoch": epoch, "done": i + 1},
                                       mine, generator)
    run.divergence.settle(final=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    epoch_time = carried_s + time.perf_counter() - t_epoch - paused
    progress.close()
    run.clock.flush()
    rows = run.clock.restart()
    entry = _epoch_entry(epoch, count, plan, epoch_time, loss_sum, world, rate,
                         run.cpu.end_epoch(), epoch in run.warm)
    entry.update(run.noise.end_epoch(epoch))
    if run.profiler.covers(first_step, run.step):
        entry["profiled"] = True  # slowed by the profiler: left out of the steady figures
    if part or (run.resumed and epoch == run.position["epoch"]):
        entry["resumed"] = True  # its time spans a restart: a warm-up epoch again
    if epoch % cfg.eval_every == 0 or epoch == plan.epochs:
        run.strategy.before_evaluation()
        if cfg.evaluate_test:
            entry["test_loss"], entry["test_accuracy"] = evaluate(
                run.strategy.local_module(), run.bundle.test, world, max(per_device, 256),
                lambda: _autocast(cfg, device))
        if run.bundle.val is not None:  # --val-fraction: what a search may look at
            entry["val_loss"], entry["val_accuracy"] = evaluate(
                run.strategy.local_module(), run.bundle.val, world, max(per_device, 256),
                lambda: _autocast(cfg, device))
    entry["elapsed_s"] = time.perf_counter() - run.t_start
    return entry, rows


def _step(run: _Run, batches, loss_sum: torch.Tensor) -> float:
    """One optimizer step over ``accumulate`` micro-batches, timed by phase; its rate."""
    cfg, plan, clock, strategy, optimizer = run.cfg, run.plan, run.clock, run.strategy, \
        run.optimizer
    accumulate = cfg.accumulate
    run.step += 1
    step = run.step
    run.faults.before_step(step, plan.derived.per_device_batch)
    rate = lr_rule.lr_at(step - 1, base_lr=cfg.lr, effective_lr=plan.derived.effective_lr,
                         warmup_steps=plan.warmup_steps, total_steps=plan.total_steps,
                         schedule=cfg.lr_schedule, steps_per_epoch=plan.steps_per_epoch,
                         milestones=cfg.lr_milestones, gamma=cfg.lr_gamma)
    for group in optimizer.param_groups:
        group["lr"] = rate
    prof = run.profiler
    prof.step_begins(step)
    clock.start()
    with prof.phase("data"):
        micro = [next(batches) for _ in range(accumulate)]
    clock.mark()
    with prof.phase("compute"):
        for m, (x, y) in enumerate(micro):
            with strategy.accumulating(last=m == accumulate - 1), \
                    _autocast(cfg, run.world.device):
                loss = run.faults.loss(step, run.loss_fn(run.net(x), y))
            step_loss = loss.detach() if m == 0 else step_loss + loss.detach()
            if m == accumulate - 1:
                run.divergence.observe(step, step_loss, rate)  # an all-reduce overlapping
            scaled = loss / accumulate
            (run.scaler.scale(scaled) if run.scaler else scaled).backward()
            loss_sum += loss.detach().double() * y.shape[0]
    clock.boundary(strategy.compute_end())
    with prof.phase("sync"):
        strategy.synchronize(optimizer)
    clock.boundary()
    with prof.phase("optimizer"):
        run.noise.observe()  # the averaged gradient, before the optimizer uses it
        strategy.step(optimizer, run.scaler)
        optimizer.zero_grad(set_to_none=True)
    clock.boundary()
    with prof.phase("sync"):
        strategy.after_step(step)
        run.divergence.settle()  # decides the step before: its wait, if any, counts as sync
    clock.stop()
    prof.step_ends(step)
    return rate


def _steady(run: _Run) -> tuple:
    """The step-time rows that count as steady state, what was left out, and where they are.

    Warm-up epochs are left out: the first, and the one each resume continued in (a new
    process warms up again)."""
    epochs = run.epochs
    warm = [e["epoch"] for e in epochs if e["warmup"]]
    profiled = [e["epoch"] for e in epochs if e.get("profiled") and not e["warmup"]]
    steady = [e for e in epochs if not e["warmup"] and not e.get("profiled")]
    if steady:
        rows = [row for e in steady for row in run.rows.get(e["epoch"], [])]
        if profiled:
            return (rows, f"{epochs_named(warm)} (warm-up) and {epochs_named(profiled)} "
                          "(profiled)", f"the steps of {epochs_named([e['epoch'] for e in steady])}")
        if warm == [1] and [e["epoch"] for e in steady] == list(range(2, epochs[-1]["epoch"] + 1)):
            partial = "" if epochs[-1]["steps"] == run.plan.steps_per_epoch else \
                f" (the partial epoch {epochs[-1]['epoch']})"
            return rows, "epoch 1 (warm-up)", f"steps {epochs[0]['steps'] + 1}-{run.step}{partial}"
        return (rows, f"{epochs_named(warm)} (warm-up: the first, and each one a resumed run "
                      "continued in)", f"the steps of {epochs_named([e['epoch'] for e in steady])}")
    # no steady epoch: the last one's first tenth (at least a step) stands in for the warm-up
    last = epochs[-1]["epoch"]
    warmup_rows = run.rows.get(last, [])
    cut = min(max(1, len(warmup_rows) // 10), len(warmup_rows) - 1)
    if len(epochs) > 1 or run.resumed:
        where = f"epoch {last} (each earlier epoch a warm-up)" if len(epochs) > 1 else \
            f"epoch {last} (the only one, after a resume)"
    else:
        where = "the only epoch" if run.plan.epochs == 1 else \
            "epoch 1 (training stopped at the target there)"
    return (warmup_rows[cut:], f"first {cut} steps of {where}",
            f"steps {cut + 1}-{len(warmup_rows)} of {where}")


def _epoch_entry(epoch: int, steps: int, plan: Plan, epoch_time: float,
                 loss_sum: torch.Tensor, world: World, rate: float, cpu: list[float],
                 warmup: bool) -> dict:
    """Train loss over every sample of the epoch on all ranks; wall time of the slowest rank;
    what else used the CPUs meanwhile (``cpu``: this rank's ``CpuWatch.end_epoch``)."""
    samples = steps * plan.derived.global_batch
    totals = torch.stack([loss_sum, torch.tensor(float(samples) / world.size,
                                                 dtype=torch.float64, device=loss_sum.device)])
    dist.all_reduce(totals)
    mine = torch.tensor([epoch_time, *cpu], dtype=torch.float64, device=loss_sum.device)
    gathered = [torch.zeros_like(mine) for _ in range(world.size)]
    dist.all_gather(gathered, mine)
    per_rank = [float(g[0]) for g in gathered]
    other, steal = epoch_load([g[1:].tolist() for g in gathered])
    train_loss = float(totals[0] / totals[1])  # finite: every step's loss was checked
    wall = max(per_rank)
    return {"epoch": epoch, "warmup": warmup, "steps": steps,
            "partial": steps < plan.steps_per_epoch, "wall_time_s": wall,
            "wall_time_s_per_rank": per_rank, "samples": samples,
            "throughput": samples / wall if wall > 0 else None, "train_loss": train_loss,
            "test_loss": None, "test_accuracy": None, "lr": rate,
            "other_cores": other, "steal_cores": steal}


def _time_to_accuracy(cfg: TrainConfig, entry: dict, tta: dict | None) -> dict | None:
    if cfg.target_accuracy is None:
        return None
    if tta and tta["reached"]:
        return tta
    accuracy = entry["test_accuracy"] if cfg.evaluate_test else entry.get("val_accuracy")
    reached = accuracy is not None and accuracy >= cfg.target_accuracy
    return {"target": cfg.target_accuracy, "reached": reached,
            "split": "test" if cfg.evaluate_test else "validation",
            "epoch": entry["epoch"] if reached else None,
            "elapsed_s": entry["elapsed_s"] if reached else None}


def _banner(cfg: TrainConfig, world: World, plan: Plan, bundle) -> None:
    d = plan.derived
    threads = torch.get_num_threads()
    rule = "" if cfg.lr_scaling == "none" else \
        f" ({cfg.lr_scaling} scaling from base batch {d.base_batch})"
    warm = f", warm-up {cfg.warmup_epochs:g} epochs" if cfg.warmup_epochs else ""
    accumulate = f" x {cfg.accumulate} accumulation steps" if cfg.accumulate > 1 else ""
    print(f"parascale: {cfg.model} on {cfg.dataset}, {world.size} worker(s) on "
          f"{world.device.type} ({world.backend}, {world.launcher} launch, {threads} thread(s) "
          f"per worker), sync {cfg.sync}", flush=True)
    print(f"  batch {d.per_device_batch} per device x {world.size} workers{accumulate} = "
          f"{d.global_batch} global; lr {cfg.lr:g} -> {d.effective_lr:g}{rule}{warm}", flush=True)
    held = f"{len(bundle.val)} validation samples" if bundle.val is not None else ""
    evaluated = f"{len(bundle.test)} test samples" + (f", {held}" if held else "") \
        if cfg.evaluate_test else f"{held} (the test set is not evaluated)"
    print(f"  {plan.total_steps} steps: {plan.epochs} epoch(s) of {plan.steps_per_epoch} steps "
          f"over {len(bundle.train)} training samples; {evaluated}", flush=True)


def _epoch_line(entry: dict, plan: Plan) -> str:
    acc = entry["test_accuracy"]
    test = f", test loss {entry['test_loss']:.4f}, accuracy {acc:.2%}" if acc is not None else ""
    if entry.get("val_accuracy") is not None:
        test += f", validation accuracy {entry['val_accuracy']:.2%}"
    notes = (["resumed"] if entry.get("resumed") else []) + \
        (["profiled"] if entry.get("profiled") else []) + \
        (["warm-up"] if entry["warmup"] else [])
    if entry["partial"]:
        notes.append(f"partial, {entry['steps']} of {plan.steps_per_epoch} steps")
    note = f" ({'; '.join(notes)})" if notes else ""
    if entry.get("noise_scale") is not None:
        test += f", noise scale {entry['noise_scale']:,.0f}"
    return (f"epoch {entry['epoch']}/{plan.epochs}{note}: {entry['wall_time_s']:.2f} s, "
            f"{entry['throughput']:,.0f} samples/s, train loss {entry['train_loss']:.4f}{test}")
