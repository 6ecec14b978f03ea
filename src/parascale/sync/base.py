"""The interface every synchronisation strategy implements; the trainer knows nothing else.

A training step, as the loop runs it::

    for each micro-batch:                       # phase "compute"
        with strategy.accumulating(last=...):   #   no gradient exchange on non-final micro-batches
            forward, backward
    strategy.compute_end()                      # when compute really ended, if known better
    strategy.synchronize(optimizer)             # phase "sync": exposed communication, if any
    strategy.step(optimizer, scaler)            # phase "optimizer"
    strategy.after_step(step)                   # phase "sync" too: e.g. local SGD's averaging
    ...
    strategy.finish()                           # once, after the last step (collective)

Before any of it, once per run, the strategy's class may ``resolve`` what the configuration left
open (SMA's ``--learners auto``); the strategy built from the result ``adopt``s its notes.

A checkpoint (``--checkpoint-every``) asks every rank for ``strategy.state_dict()`` between
two steps and gives it back through ``load_state_dict`` after ``wrap`` on resume, once the
model and optimizer are restored. ``replicas_agree`` says whether a checkpoint may keep rank
0's model and optimizer alone, or must keep every rank's; ``shards_checkpoint`` that each rank
writes its own part of them through torch.distributed.checkpoint instead
(training/checkpoint/sharded.py), which a run on another number of workers can read back.

Strategies that overlap communication with backward (DDP) do their work inside backward and
report, through ``compute_end``, the moment the last gradient was ready: the wait after it is
exposed synchronisation, so the clock moves it from "compute" to "sync". Strategies that
communicate after backward do it in ``synchronize``, so the record's phase split shows what each
one costs (docs/strategies.md).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from parascale import lazy
from parascale.config import TrainConfig
from parascale.sync.options import Settings
from parascale.sync.traits import Pattern, Traits

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch import nn

    from parascale.runtime.world import World
else:  # the registry is read without torch (--help, report): imported on first use
    torch = lazy.module("torch", globals())
    dist = lazy.module("torch.distributed", globals(), "dist")
    nn = lazy.module("torch.nn", globals())

NOTHING = contextlib.nullcontext()  # reusable, so a step need not build one per micro-batch


def unwrap(module: nn.Module) -> nn.Module:
    """``module`` without DDP's or torch.compile's wrapper (DDP keeps the model in .module,
    torch.compile in ._orig_mod; their state_dict keys differ from the model's)."""
    while True:
        inner = getattr(module, "module", None)
        if inner is None:
            inner = getattr(module, "_orig_mod", None)
        if inner is None or not isinstance(inner, nn.Module):
            return module
        module = inner


@dataclass
class Resolved:
    """What a strategy decided before training (``Strategy.resolve``): the configuration with
    it filled in, the seconds of training steps the decision took (training time: they count
    towards time-to-accuracy), what the built strategy keeps of it (``adopt``), and the options
    it decided, which a checkpoint keeps so that the run continues with them (``resolve``
    reads them back from the checkpoint's progress)."""

    cfg: TrainConfig
    seconds: float = 0.0
    notes: Any = None
    decided: dict[str, Any] = field(default_factory=dict)


class GradientWatcher(Protocol):
    """Shown this rank's own gradients before the exchange, in one or more pieces per step
    (DDP's buckets; a flat buffer): the gradient noise scale (training/observe/noise.py) is one."""

    def before_exchange(self, gradients: torch.Tensor) -> None: ...


class Strategy:
    """Default: plain local training (no exchange). Subclasses override what they change."""

    #: the module the loop trains, from ``wrap`` on (there is none before)
    model: nn.Module

    name = "base"
    #: what the strategy is, whatever its options (sync/traits.py)
    traits = Traits()
    #: its options, typed (sync/options.py); ``self.settings`` holds this run's
    Settings: type[Settings] = Settings

    # What depends on the options: class methods of the settings, so that the registry answers
    # them before any strategy is built (predict and report hold a record, not a run).

    @classmethod
    def lockstep(cls, settings: Any) -> bool:
        """Whether the ranks exchange every step, so that they are in lockstep and a per-step
        collective adds no synchronisation point (the divergence check all-reduces the loss);
        False where that would add synchronisation the strategy does not have."""
        return False

    @classmethod
    def agrees(cls, settings: Any) -> bool:
        """Whether every rank's model and optimizer state are the same after every step (the
        ranks exchange gradients synchronously): a checkpoint then keeps rank 0's alone."""
        return False

    @classmethod
    def equivalence(cls, settings: Any) -> str | None:
        """How N workers with B/N samples each relate to one worker with B (``traits.GRADIENT``:
        they end alike under any optimizer; ``traits.UPDATE``: under an optimizer whose update
        is linear in the gradient), or None: they need not end alike."""
        return None

    @classmethod
    def pattern(cls, settings: Any) -> Pattern | None:
        """How a step's exchange moves its bytes, for the cost model; None when it exchanges
        nothing the model can describe."""
        return None

    @classmethod
    def exchange_size(cls, sent: float, n: int, settings: Any) -> float | None:
        """The bytes that enter the exchange (S), from what rank 0 sent per step on ``n``
        workers (``bytes_per_step``, the strategy's own count), or None."""
        pattern = cls.pattern(settings)
        return None if pattern is None else pattern.exchanged(sent, n)

    @classmethod
    def stages(cls) -> dict[int, dict[str, Any]]:
        """The ZeRO stages it runs (the memory model's rows: 1 shards the optimizer state, 2
        the gradients too, 3 the parameters too), each with the options that choose it."""
        return {}

    @classmethod
    def settings_of(cls, cfg: TrainConfig) -> Any:
        """``cfg``'s settings of this strategy (its options, typed)."""
        return cls.Settings.of(cfg.strategy.sync_options)

    @classmethod
    def refuse(cls, cfg: TrainConfig) -> str | None:
        """One line if ``cfg`` combines this strategy with settings it cannot run, else None."""
        return None

    @classmethod
    def resumes_resized(cls, cfg: TrainConfig) -> bool:
        """Whether a checkpoint of this strategy resumes on another number of workers (with
        the same global batch): its model and optimizer are each rank's part, which DCP
        reshards on load (``shards_checkpoint``), or kept once because every rank holds the
        same, and nothing else it keeps per rank depends on the worker count."""
        return cls.traits.shards_checkpoint

    # What the launcher and the batch arithmetic ask of a strategy before any worker starts
    # (class methods: no world yet), so that neither names one.

    @classmethod
    def helper_processes(cls, cfg: TrainConfig) -> int:
        """Processes this strategy starts beside the workers, one CPU thread each (counted
        against the cores a local launch may use)."""
        return 0

    @classmethod
    def refuse_model(cls, cfg: TrainConfig, model: nn.Module, workers: int) -> str | None:
        """Why this strategy cannot train ``model`` on ``workers`` workers, in one line that
        says what would do instead, or None. Asked before any worker starts, of the model as
        the launcher builds it to check it."""
        return None

    @classmethod
    def replicas_per_device(cls, cfg: TrainConfig) -> int:
        """Model replicas a device trains at once, each on its own ``--batch-size``: a device
        takes this many batches a step (1 while the count is still to be resolved)."""
        return 1

    @classmethod
    def resolves_before_training(cls, cfg: TrainConfig) -> bool:
        """Whether the workers decide a setting of ``cfg`` on real steps before training (the
        step plan is then made again once it is decided)."""
        return False

    @classmethod
    def resolve(cls, cfg: TrainConfig, world: World, bundle,
                build_model: Callable[[], nn.Module], saved: dict[str, Any] | None) -> Resolved:
        """Decide, before the strategy is built, what ``cfg`` leaves to it (SMA's
        ``--learners auto``; ``resolves_before_training`` says whether there is any), on real
        steps if need be. ``saved``: the progress of the
        checkpoint the run continues from (what was decided then stands). Collective."""
        return Resolved(cfg)

    def adopt(self, resolved: Resolved) -> None:
        """Keep what ``resolve`` noted (for the record), after ``__init__``."""

    # What the trainer asks of the built strategy, from its traits and settings.

    @property
    def exchanges_gradients(self) -> bool:
        return self.traits.exchanges

    @property
    def exchanges_every_step(self) -> bool:
        return self.lockstep(self.settings)

    @property
    def replicas_agree(self) -> bool:
        return self.agrees(self.settings)

    @property
    def shards_checkpoint(self) -> bool:
        return self.traits.shards_checkpoint

    def __init__(self, cfg: TrainConfig, world: World):
        self.cfg = cfg
        self.world = world
        #: this run's options, typed: an instance of the strategy's ``Settings``
        self.settings = self.Settings.of(cfg.strategy.sync_options)
        #: bytes this rank sends per optimizer step, where the strategy knows it
        self.bytes_per_step: int | None = None
        #: who is shown this rank's own gradients before the exchange (``watch_gradients``)
        self.watcher: GradientWatcher | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        """Take the model (already on the device) and return the module the loop trains."""
        self.model = model
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Take the optimizer built over the wrapped model's parameters and return the one the
        loop steps (a sharded strategy splits its state across the ranks)."""
        return optimizer

    def optimizer_part(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer over this rank's part of the state, for a sharded checkpoint
        (``shards_checkpoint``): the one the loop steps, unless that one only delegates."""
        return optimizer

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward and backward; ``last`` is the final one."""
        return NOTHING

    def compute_end(self) -> Any | None:
        """When this step's compute ended, if the strategy knows it better than the clock.

        A ``time.perf_counter()`` value (or a CUDA event on GPUs), or None for "now". DDP's
        backward returns only after its last allreduce; the moment its last gradient bucket was
        ready ends compute, and the wait after it is exposed synchronisation.
        """
        return None

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        """Exchange gradients after backward (for strategies that do not overlap it).

        ``optimizer`` is there for strategies that update elsewhere (a parameter server needs
        the step's learning rate); the others ignore it.
        """

    def step(self, optimizer: torch.optim.Optimizer, scaler: Any | None = None) -> None:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    def after_step(self, step: int) -> None:
        """Called after every optimizer step with the 1-based global step number; its time
        counts as synchronisation."""

    def finish(self) -> None:
        """Collective, once after the last step and before the record: stop helpers, gather
        what ``measurements`` reports."""

    def local_module(self) -> nn.Module:
        """The plain model (no wrappers): for evaluation and for saving."""
        return unwrap(self.model)

    def model_state_dict(self) -> dict[str, Any]:
        """The whole model's state_dict for model.pt, on rank 0 after ``finish`` (a sharded
        strategy gathers it in ``finish``, which every rank calls)."""
        return self.local_module().state_dict()

    @property
    def evaluates_in_lockstep(self) -> bool:
        """Forward communicates (FSDP gathers each unit's parameters in it), so every rank
        must make as many forward passes in evaluation as every other (training/evaluate.py
        gives the ranks with fewer batches passes whose figures it drops)."""
        return False

    def before_evaluation(self) -> None:
        """Make buffers (batch-norm statistics) agree across ranks before evaluating.

        Parameters already agree under a synchronous strategy; buffers are updated locally in
        every forward, so rank 0's are broadcast to keep evaluation one model, not N.
        """
        if self.world.size > 1 and self.exchanges_gradients:
            for buffer in self.local_module().buffers():
                dist.broadcast(buffer, src=0)

    def state_dict(self) -> dict[str, Any]:
        """This rank's state beyond the model and the optimizer, for a checkpoint: what the
        strategy needs to go on exactly where it was (steps since the last average, a parameter
        server's momentum...), and what ``measurements`` will report. Collective: every rank
        calls it after the same step. Tensors, numbers, strings, lists and dicts only (the file
        is read with ``weights_only=True``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (this rank's ``state_dict()`` of the checkpoint), after
        ``wrap`` and after the model and the optimizer were restored. Collective."""

    def noise_refusal(self) -> str | None:
        """Why the gradient noise scale cannot be measured under this strategy, or None when it
        can: after ``synchronize`` every rank's gradients are the global batch's mean, and the
        strategy shows a ``watch_gradients`` watcher this rank's own before the exchange."""
        if self.traits.mean_gradient:
            return None
        # parascale.sync.noise_refusal adds the strategies it is measured under
        return f"--sync {self.name} never forms the global batch's mean gradient on the workers"

    def watch_gradients(self, watcher: GradientWatcher) -> None:
        """From now on, show ``watcher`` every step's local gradients before they are exchanged
        (a strategy that can: see ``noise_refusal``)."""
        self.watcher = watcher

    def options(self) -> dict[str, Any]:
        """Strategy settings for the run record (``derived.sync_options``): the declared
        options that apply; subclasses add what they compute (byte counts)."""
        return self.settings.applying()

    def measurements(self) -> dict[str, Any] | None:
        """What the strategy measured beyond the step phases (the record's ``sync`` section),
        on rank 0 after ``finish``; None when there is nothing more."""
        return None

    def explain(self, error: RuntimeError) -> RuntimeError:
        """The failure behind a communication ``error`` that this strategy can name (a helper
        process of its own that died), else ``error`` itself."""
        return error
