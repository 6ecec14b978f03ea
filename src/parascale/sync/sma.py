"""Crossbow's Synchronous Model Averaging: several learners per device and a central model.

Koliousis et al., "Crossbow: Scaling Deep Learning with Small Batch Sizes on Multi-GPU Servers"
(VLDB 2019); the arithmetic follows their CUDA/C sources (github.com/lsds/Crossbow). Each of the
M learners on a device is a model replica with its own batch (``--batch-size`` each, so a device
trains M batches a step) and its own momentum-SGD state: one SGD optimizer over the learners'
parameters is M independent ones, since momentum and weight decay act element by element. Every
``period`` steps::

    c_j = alpha * (w_j_old - z)        # w_j_old: learner j's weights before this step's update
    w_j -= c_j                         # each learner is pulled toward the central model
    delta = sum_j c_j                  # over the device's learners, then one all-reduce
    delta += mu_z * delta_prev         # momentum on the central model
    z += delta

The central model ``z`` is what is evaluated, saved and recorded. Each learner keeps its own
batch-norm statistics; the central model's are the mean of every learner's, taken at each
synchronisation. Every learner is reset to ``z`` when the step schedule drops the learning rate
(a cosine schedule decays smoothly and resets nothing).

Learners run together on a device through ``sync.learners`` (replicas one after another, or
stacked parameters under ``torch.func.vmap``: ``benchmarks/learners.py`` chose the default). ``--learners auto`` is decided before training by Crossbow's
hill-climbing rule (``sync.sma_tune``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.config import TrainConfig
from parascale.sync.base import Resolved, Strategy
from parascale.sync.flat import Flat
from parascale.sync.options import Settings, option
from parascale.sync.traits import Pattern, Traits

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch import nn
else:  # the registry is read without torch: imported on first use
    torch = lazy.module("torch", globals())
    dist = lazy.module("torch.distributed", globals(), "dist")

MAX_DISTANCES = 1000  # records of the learners' distance kept; thinned by halves beyond


@dataclass(frozen=True)
class SMASettings(Settings):
    learners: int | str = option(
        1, "SMA: model replicas (learners) per device, each training on its own batch of "
        "--batch-size, or auto: Crossbow's tuner adds one while throughput grows by more than "
        "--tune-threshold, then trains with the best count.", flag=True)
    sma_alpha: float = option(
        0.1, "SMA: the pull of each learner toward the central model at a synchronisation, in "
        "(0, 1] (Crossbow: 0.1 for ResNets, 0.2 for VGG).", flag=True)
    sma_momentum: float = option(
        0.9, "SMA: momentum of the central model's update, in [0, 1) (Crossbow: 0.9).",
        flag=True)
    period: int = option(1, "SMA: synchronise with the central model every this many steps.",
                         minimum=1, flag=True)
    learner_engine: str = option(
        "auto", "SMA: how a device runs its learners: loop (one after another), vmap (stacked "
        "parameters, one batched computation per layer), or auto: vmap from 4 learners on, "
        "where it was faster here (benchmarks/learners.py).", choices=("auto", "loop", "vmap"))
    tune_threshold: float = option(
        0.1, "SMA with --learners auto: the smallest throughput gain (a fraction; Crossbow: "
        "0.1) for which one more learner per device is kept.", only_with=("learners", "auto"),
        flag=True)


class SMA(Strategy):
    name = "sma"
    traits = Traits(learners=True, optimizer="sgd",
                    optimizer_why="trains its learners with SGD and averages with its own "
                                  "momentum (Crossbow's rule)",
                    script_refusal="it trains several replicas per device, which the script's "
                                   "single model is not")
    Settings = SMASettings
    settings: SMASettings

    @classmethod
    def lockstep(cls, settings: SMASettings) -> bool:
        return settings.period == 1  # only a period of 1 exchanges every step

    @classmethod
    def equivalence(cls, settings: SMASettings) -> str | None:
        # each learner is pulled a fraction alpha toward the central model, which moves with
        # momentum of its own: no period or count of learners makes it one worker's SGD
        return None

    @classmethod
    def pattern(cls, settings: SMASettings) -> Pattern:
        # the learners' corrections, all-reduced every period steps after backward
        return Pattern(every=settings.period)

    @classmethod
    def refuse(cls, cfg: TrainConfig) -> str | None:
        settings = cls.settings_of(cfg)
        m = settings.learners
        if not (m == "auto" or (isinstance(m, int) and not isinstance(m, bool) and m >= 1)):
            return f"--learners must be a positive integer or auto, got {m!r}"
        if not 0 < settings.sma_alpha <= 1:
            return f"--sma-alpha is a fraction in (0, 1], got {settings.sma_alpha:g}"
        if not 0 <= settings.sma_momentum < 1:
            return f"--sma-momentum must be in [0, 1), got {settings.sma_momentum:g}"
        if not 0 <= settings.tune_threshold < 10:
            return (f"--tune-threshold is a fraction (0.1 for 10%), got "
                    f"{settings.tune_threshold:g}")
        if cfg.batch.global_batch is not None:
            return ("--sync sma takes --batch-size, each learner's own batch, not "
                    "--global-batch (the global batch is workers x learners x batch size)")
        if cfg.optim.lr_scaling != "none":
            return ("--sync sma trains every learner at --lr on its own small batch (Crossbow "
                    "scales no learning rate); leave out --lr-scaling")
        if cfg.batch.accumulate != 1:
            return "--sync sma runs one batch per learner a step; leave out --accumulate"
        if cfg.strategy.compile:
            return "--sync sma runs its learners as one module of its own; leave out --compile"
        if cfg.job.task is not None and m == "auto":
            return ("--learners auto tunes on the built-in image tasks' batches; give --task "
                    "a count of learners, e.g. --learners 2")
        return None

    @classmethod
    def replicas_per_device(cls, cfg: TrainConfig) -> int:
        """The learners: ``--batch-size`` is each learner's, so a device trains that many."""
        learners = cls.settings_of(cfg).learners
        return learners if isinstance(learners, int) else 1

    @classmethod
    def resolves_before_training(cls, cfg: TrainConfig) -> bool:
        """``--learners auto`` is decided by Crossbow's auto-tuner (``sync.sma_tune``)."""
        return bool(cls.settings_of(cfg).learners == "auto")

    @classmethod
    def resolve(cls, cfg: TrainConfig, world, bundle, build_model, saved) -> Resolved:
        """``--learners auto``: tuned once per run, on real steps before training; a run that
        continues from a checkpoint keeps the count it was tuned to (its ``decided`` options,
        or, from a checkpoint written before those, its ``learners``)."""
        if not cls.resolves_before_training(cfg):
            return Resolved(cfg)
        if saved is not None:
            count = (saved.get("decided") or {}).get("learners", saved.get("learners"))
            return Resolved(_with_learners(cfg, count), decided={"learners": count})
        from parascale.sync import sma_tune

        count, tuning, seconds = sma_tune.tune(cfg, world, bundle, build_model, cls)
        return Resolved(_with_learners(cfg, count), seconds, tuning, {"learners": count})

    def __init__(self, cfg: TrainConfig, world):
        super().__init__(cfg, world)
        #: the auto-tuner's decisions (``sync.sma_tune``), from ``resolve``
        self.tuning: list[dict[str, Any]] = []

    def adopt(self, resolved: Resolved) -> None:
        self.tuning = list(resolved.notes or [])

    @property
    def count(self) -> int:
        """Learners on this device (``auto`` was resolved before the strategy was built)."""
        learners = self.settings.learners
        return learners if isinstance(learners, int) else 1

    def wrap(self, model: nn.Module) -> nn.Module:
        from parascale.sync.learners import engine_for, make_learners

        self.model = model  # the central model z
        self.central = Flat(model)
        self.z = self.central.gather_params(self.central.new())
        self.delta_prev = torch.zeros_like(self.z)
        self.engine = engine_for(self.count, self.settings.learner_engine)
        self.learners = make_learners(model, self.count, self.engine)
        self.steps_since = 0
        self.syncs = 0
        self.resets = 0
        self.distances: list[dict[str, float]] = []
        self.central_spread = 0.0  # largest difference between ranks' checksums of z
        self._stride = 1  # keep every _stride-th synchronisation's distances
        self._old: torch.Tensor | None = None
        self._rate: float | None = None
        self._drop = False
        n = self.world.size
        self.bytes_per_sync = int(2 * (n - 1) / n * self.central.bytes)
        self.bytes_per_step = self.bytes_per_sync // self.settings.period
        return self.learners

    def step(self, optimizer: torch.optim.Optimizer, scaler: Any | None = None) -> None:
        # the loss is the mean over the device's M batches: each learner's gradient is 1/M of
        # its own batch's mean-loss gradient, which its SGD must see whole
        if self.count > 1:
            for p in self.learners.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.count)
        rate = optimizer.param_groups[0]["lr"]
        self._drop = self._drop or (self.cfg.optim.lr_schedule == "step" and self._rate is not None
                                    and rate < self._rate)
        self._rate = rate
        if self.steps_since + 1 == self.settings.period:
            self._old = self.learners.vectors()  # w_old: before this step's update
        super().step(optimizer, scaler)

    def after_step(self, step: int) -> None:
        self.steps_since += 1
        if self.steps_since < self.settings.period:
            return
        self.steps_since = 0
        self._average()
        if self._drop:  # Crossbow: every learner restarts from z when the rate drops
            self.learners.set_vectors(self.z.expand(self.count, -1))
            self.resets += 1
            self._drop = False

    def _average(self) -> None:
        with torch.no_grad():  # a decorator would import torch with the registry
            old, z = self._old, self.z
            if old is None:  # taken in step() of the period's last step
                raise RuntimeError("SMA averaged without the learners' weights before the step")
            now = self.learners.vectors()
            self._note_distance(now)
            corrections = self.settings.sma_alpha * (old - z)
            self.learners.set_vectors(now - corrections)
            delta = corrections.sum(0)
            if self.world.size > 1:
                dist.all_reduce(delta)
            delta += self.settings.sma_momentum * self.delta_prev
            self.delta_prev = delta
            z += delta
            self.central.scatter_params(z)
            self._average_buffers()
            self._old = None
            self.syncs += 1

    def _average_buffers(self) -> None:
        """The central model's batch-norm statistics: the mean of every learner's on every
        device; counters (``num_batches_tracked``) from the first learner."""
        for mine, stacked in zip(self.model.buffers(), self.learners.buffer_tensors()):
            if not mine.is_floating_point():
                mine.copy_(stacked[0])
                continue
            total = stacked.sum(0)
            if self.world.size > 1:
                dist.all_reduce(total)
            mine.copy_(total / (self.count * self.world.size))

    def _note_distance(self, now: torch.Tensor) -> None:
        """L2 distance of each learner from the central model, just before a synchronisation:
        mean and largest over every learner of every device. The same message carries each
        rank's checksum of z: the central models must agree, and the record says if they did."""
        if self.syncs % self._stride:
            return
        d = (now - self.z).norm(dim=1).double()
        mine = torch.stack([d.sum(), d.max(), self.z.double().sum()])
        every = [torch.zeros_like(mine) for _ in range(self.world.size)]
        if self.world.size > 1:
            dist.all_gather(every, mine)
        else:
            every = [mine]
        sums = [float(e[2]) for e in every]
        self.central_spread = max(self.central_spread, max(sums) - min(sums))
        self.distances.append({"sync": self.syncs + 1,
                               "mean": sum(float(e[0]) for e in every)
                               / (self.count * self.world.size),
                               "max": max(float(e[1]) for e in every)})
        if len(self.distances) > MAX_DISTANCES:  # a long run: every other one, from now on too
            self.distances = self.distances[::2]
            self._stride *= 2

    def state_dict(self) -> dict:
        """The central model (parameters and batch-norm statistics) and its momentum, the
        schedule's last rate, the counters and the measurements; the learners are the trained
        module, which the checkpoint keeps for every rank."""
        if self._old is not None:  # taken in step() and used in after_step(): never between
            raise RuntimeError("SMA state asked for in the middle of a step")
        return {"central": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "delta_prev": self.delta_prev.clone(), "steps_since": self.steps_since,
                "syncs": self.syncs, "resets": self.resets, "rate": self._rate,
                "drop": self._drop, "distances": [dict(d) for d in self.distances],
                "stride": self._stride, "central_spread": self.central_spread,
                "tuning": [dict(t) for t in self.tuning]}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():  # a decorator would import torch with the registry
            self.model.load_state_dict(state["central"])
            self.central.gather_params(self.z)
            self.delta_prev.copy_(state["delta_prev"])
            self.steps_since, self.syncs = int(state["steps_since"]), int(state["syncs"])
            self.resets, self._rate = int(state["resets"]), state["rate"]
            self._drop = state["drop"]
            self.distances = [dict(d) for d in state["distances"]]
            self._stride = int(state["stride"])
            self.central_spread = float(state["central_spread"])
            self.tuning = [dict(t) for t in state["tuning"]]

    def before_evaluation(self) -> None:
        """z already agrees on every rank (the same corrections, all-reduced)."""

    def local_module(self) -> nn.Module:
        return self.model

    def options(self) -> dict:
        return {**super().options(), "learners": self.count, "learner_engine": self.engine,
                "bytes_per_sync": self.bytes_per_sync}

    def measurements(self) -> dict:
        return {"learners": self.count, "syncs": self.syncs, "resets": self.resets,
                "distance": self.distances, "distance_every": self._stride,
                "central_spread": self.central_spread,
                "tuning": self.tuning}


def _with_learners(cfg: TrainConfig, count: int) -> TrainConfig:
    return cfg.replace(sync_options={**cfg.strategy.sync_options, "learners": count})
