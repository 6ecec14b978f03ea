"""The run a user's script holds: ``run = parascale.script.start()``.

It joins the world the script was started in (``parascale run``'s, torchrun's, srun's, or a
world of one when the script runs as a plain process), wraps the model and optimizer for the
chosen strategy, shards the training DataLoader, and measures each step as the trainer does
(training/observe/measure.py): the sharded loader marks where a step starts and where its batch is
ready, the optimizer's ``step`` (patched on the instance, so the object stays the user's, and
LR schedulers and ``isinstance`` keep working) marks compute, exposed sync and optimizer time.
One pass over the sharded loader is one epoch of the record.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parascale import record as rec
from parascale import sync
from parascale.batch import Derived, Plan
from parascale.config import TrainConfig
from parascale.files import atomic_write
from parascale.runtime import World
from parascale.tasks.base import to_device
from parascale.script import shard
from parascale.script.recording import Measured, make_record
from parascale.training.observe.tensorboard import open_tensorboard
from parascale.training.observe.contention import CpuWatch
from parascale.training.record.epochs import epoch_entry
from parascale.training.observe.measure import LossTally, StepClock
from parascale.training.record.progress import Progress

#: metrics whose direction needs no saying
DIRECTIONS = {"loss": False, "accuracy": True}


class Run:
    """One copy of the script's place in the job, and what it measured."""

    def __init__(self, cfg: TrainConfig, world: World, name: str, args: list[str]):
        self.cfg, self.world, self.name, self.args = cfg, world, name, args
        self.device, self.rank, self.size = world.device, world.rank, world.size
        self.is_main = world.is_main
        self.strategy: sync.Strategy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.plan: Plan | None = None
        self.clock = StepClock(self.device)
        self.losses = LossTally(self.device)
        self.cpu = CpuWatch(world.host, world.local_rank)
        self.progress = Progress()
        self.directions: dict[str, bool] = {}
        self.started, self.t_called = rec.now(), time.perf_counter()
        self.first_step_at: float | None = None
        self._open = False  # a step began (its batch is out) and its optimizer step is to come
        self._epoch: dict[str, Any] | None = None  # the pass over the training data under way
        self._samples = 0
        self._steps = 0  # measured steps of the pass under way
        self._kept: list[torch.Tensor] = []  # the pass's losses, detached (run.backward)
        self._pending: dict[str, float] = {}  # metrics logged before the first epoch ended
        self.finished = False
        #: whether epochs are gathered into a record: not in a plain process (a world of one
        #: outside parascale run), where nothing is written and the steps alone are timed
        self.recording = world.launcher != "plain"
        self.tensorboard = open_tensorboard(cfg.output.tensorboard, world.is_main)

    # --- the model and optimizer ------------------------------------------------------------

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
              ) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """The model to train (on this rank's device, wrapped for --sync) and the optimizer,
        built over the model's parameters beforehand, whose ``step`` now also exchanges."""
        if self.strategy is not None:
            raise RuntimeError("setup() was called already: one model and optimizer per run")
        model = model.to(self.device)
        if self.size > 1:  # every replica starts from rank 0's parameters, whatever the seeds
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)
        self.strategy = sync.build(self.cfg, self.world)
        net = self.strategy.wrap(model)
        if optimizer is not None:
            optimizer = self.strategy.wrap_optimizer(optimizer)
            self._take_step(optimizer)
        return net, optimizer

    def _take_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        own, strategy, clock, progress = optimizer.step, self.strategy, self.clock, self.progress
        assert strategy is not None
        # what the strategy leaves as the base class's no-op is not called at all
        kind = type(strategy)
        synchronizes = kind.synchronize is not sync.Strategy.synchronize
        acts_after = kind.after_step is not sync.Strategy.after_step

        # one frame around the optimizer's own step, what it reads bound beforehand: this
        # runs every step, and on a small model each call is a visible share of the step
        def step(*args: Any, **kwargs: Any) -> Any:
            timed = self._open
            if timed:
                clock.boundary(strategy.compute_end())
            if synchronizes:
                strategy.synchronize(optimizer)
            if timed:
                clock.boundary()
            result = own(*args, **kwargs)
            if timed:
                clock.boundary()
            progress.step += 1
            if acts_after:
                strategy.after_step(progress.step)
            if timed:
                clock.stop()
                self._open = False
                self._steps += 1
            return result

        optimizer.step = step  # type: ignore[method-assign]

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, and the loss kept for the epoch's training loss."""
        loss.backward()
        # kept here, handed to the tally at the epoch's end (every batch of the pass has the
        # sampler's size): the least work per step, and no call into it
        self._kept.append(loss.detach())

    # --- data --------------------------------------------------------------------------------

    def shard(self, loader: Any, batch_size: int | None = None, shuffle: bool | None = None,
              seed: int = 0, train: bool = True) -> Any:
        """This rank's part of a DataLoader (or a dataset): every global batch split across the
        ranks, per-device batch ``batch_size`` (default the loader's); iterating it marks the
        steps. ``train=False``: a contiguous share for evaluation, every sample once."""
        dataset = getattr(loader, "dataset", loader)
        per_device = shard.batch_size_of(loader, batch_size)
        if not train:
            return shard.loader_like(loader, shard.EvalBatches(len(dataset), self.size,
                                                               self.rank, per_device))
        sampler = shard.TrainBatches(len(dataset), per_device, self.size, self.rank, seed,
                                     shard.shuffles(loader, shuffle))
        if self.plan is None:
            glob = per_device * self.size
            self.plan = Plan(Derived(self.size, per_device, glob, 0.0, glob), len(sampler), 0, 0,
                             0, len(dataset), 0)
        return _Steps(self, shard.loader_like(loader, sampler))

    def _epoch_begins(self) -> None:
        if self._epoch is not None:  # the previous pass was left before its end
            self._epoch_ends()
        now = time.perf_counter()
        if self.first_step_at is None:
            self.first_step_at, self.progress.t_start = time.time(), now
            if self.recording:
                self.cpu.start_window()
        if self.recording:
            self.cpu.start_epoch()
        self._epoch = {"t0": now, "cpu0": time.process_time()}
        self._steps = 0

    def _epoch_ends(self) -> None:
        """Collective: the epoch's record entry, from every rank's figures."""
        epoch, self._epoch = self._epoch, None
        steps = self._steps
        if not self.recording:
            self.clock.restart()
            self._kept = []
            return
        if epoch is None or steps == 0 or self.plan is None:
            return
        wall = time.perf_counter() - epoch["t0"]
        cpu_s = time.process_time() - epoch["cpu0"]
        self.clock.flush()
        number = len(self.progress.epochs) + 1
        rate = self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0
        trained = bool(self._kept)
        self.losses.extend(self._kept, self._samples)
        self._kept = []
        entry = epoch_entry(number, steps, self.plan, (wall, cpu_s),
                            self.losses.total(), self.world, rate, self.cpu.end_epoch(),
                            number == 1, self.clock.rows)
        if not trained:  # the script called loss.backward() itself: no loss was shown to us
            entry.train_loss = None
        entry.noise = {"noise_scale": None}
        entry.elapsed_s = time.perf_counter() - self.progress.t_start
        entry.metrics.update(self._pending)
        self._pending = {}
        self.losses = LossTally(self.device)
        self.progress.rows[number] = self.clock.restart()
        self.progress.epochs.append(entry)
        if self.tensorboard is not None:
            self.tensorboard.epoch(entry.to_dict())

    # --- metrics and checkpoints -------------------------------------------------------------

    def log(self, split: str = "test", higher_is_better: dict[str, bool] | None = None,
            **metrics: float) -> None:
        """Figures of the last epoch's evaluation, as ``<split>_<name>`` in its record entry
        (rank 0's values: evaluate the whole set on every rank, or a ``train=False`` shard
        and reduce). A metric other than loss and accuracy says its direction once, in
        ``higher_is_better``."""
        given = higher_is_better or {}
        for name, value in metrics.items():
            known = given.get(name, self.directions.get(name, DIRECTIONS.get(name)))
            if known is None:
                raise ValueError(f"say whether a higher or a lower {name} is better: "
                                 f"log(..., higher_is_better={{{name!r}: True}})")
            self.directions[name] = bool(known)
            key = f"{split}_{name}"
            if self.progress.epochs:
                entry = self.progress.epochs[-1]
                entry.metrics[key] = float(value)
                entry.elapsed_s = time.perf_counter() - self.progress.t_start
                if self.tensorboard is not None:  # the epoch's series were written at its end
                    self.tensorboard.epoch({"epoch": entry.epoch, key: entry.metrics[key],
                                      "elapsed_s": entry.elapsed_s})
            else:
                self._pending[key] = float(value)

    def _plain(self, obj: Any) -> Any:
        if isinstance(obj, nn.Module) and self.strategy is not None:
            return sync.base.unwrap(obj)
        return obj

    def save(self, path: str, **objects: Any) -> None:
        """Rank 0 writes ``objects`` (state_dicts of models, optimizers..., or plain values)
        to ``path`` atomically; every rank calls it, and waits until the file is there."""
        if self.is_main:
            state = {name: self._plain(o).state_dict() if hasattr(o, "state_dict") else o
                     for name, o in objects.items()}
            atomic_write(Path(path), lambda handle: torch.save(state, handle))
        if self.size > 1:
            dist.barrier()

    def load(self, path: str, **objects: Any) -> dict[str, Any]:
        """What :meth:`save` wrote; each object named is given its state back."""
        state = torch.load(path, map_location=self.device, weights_only=True)
        for name, obj in objects.items():
            self._plain(obj).load_state_dict(state[name])
        return state

    def finish(self) -> dict[str, Any] | None:
        """Collective, once (``parascale run`` calls it when the script returns): rank 0 makes
        the run record and writes it into --out; the record on rank 0, None elsewhere (and in
        a plain process, which keeps no record)."""
        if self.finished:
            return None
        self.finished = True
        if self._epoch is not None:
            self._epoch_ends()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if not self.recording:
            if self.strategy is not None:
                self.strategy.finish()
            return None
        if not self.progress.epochs or self.strategy is None:
            from parascale.errors import KnownFailure

            raise KnownFailure("the script took no measured step: call run.setup(model, "
                               "optimizer), iterate over run.shard(loader) and call "
                               "optimizer.step() in the loop")
        assert self.plan is not None  # a measured step was taken: the loader made the plan
        return make_record(Measured(
            self.cfg, self.world, self.name, self.args, self.plan, self.strategy, self.progress,
            self.cpu, dict(self.directions),
            self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0,
            self.started, self.progress.t_start - self.t_called, self.first_step_at))


class _Steps:
    """The sharded training loader: each batch it hands out begins a measured step."""

    def __init__(self, run: Run, loader: Any):
        self.run, self.loader = run, loader
        self.batch_size = loader.batch_sampler.per_device
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        run, clock = self.run, self.run.clock
        cpu = run.device.type == "cpu"
        run._epoch_begins()
        # every batch is the sampler's per_device samples (TrainBatches drops the incomplete
        # last one): the loss's weight needs no look into the batch
        run._samples = self.batch_size
        batches = iter(self.loader)
        while True:
            clock.start()
            try:
                batch = next(batches)
            except StopIteration:
                break
            if not cpu:
                batch = to_device(batch, run.device)
            clock.mark()
            run._open = True
            yield batch
        run._epoch_ends()
