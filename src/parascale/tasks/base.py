"""The task contract: what is trained and how it is judged, declared as one object.

The trainer consumes a :class:`Task` without knowing what kind of job it is: image
classification from the registries is one family of built-in tasks (``tasks.builtin``), and a
user's ``--task package.module:function`` returns one of their own (docs/tasks.md).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.data.split import on_device
from parascale.errors import UsageError
from parascale.runrecord import Unit, task_section

if TYPE_CHECKING:
    import torch
    from torch import nn

    from parascale.config import OptimConfig
else:  # names and target checks run without torch (the command line's first errors)
    torch = lazy.module("torch", globals())

LOSS = "loss"
"""Every task's loss is also a metric of its evaluation, lower is better, under this name."""

NAME_CHARACTERS = 64
"""The longest name parascale shows (a task's name and unit, a metric's name)."""


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be a name parascale shows on the console, in logs, records and
    reports, or None when it can: a name is text of 1 to ``NAME_CHARACTERS`` printable
    characters, not only spaces (no newline, tab, terminal escape or other control
    character)."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not text"
    if not value.strip():
        return "is empty"
    if len(value) > NAME_CHARACTERS:
        return f"has {len(value)} characters"
    unprintable = next((c for c in value if not c.isprintable()), None)
    if unprintable is not None:
        return f"holds the control character {unprintable!r}"
    return None


def check_name(value: object, what: str, example: str = "mae") -> str:
    """``value`` when it is a name (:func:`name_problem`), else one line: ``what`` (e.g.
    "task 'm:f': f(): name") with the value shown escaped and cut short, and an example of a
    good one."""
    problem = name_problem(value)
    if problem is None:
        return str(value)
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:32] + "..." + shown[-1]
    raise UsageError(f"{what} {shown} {problem}; a name is 1 to {NAME_CHARACTERS} printable "
                     f"characters, e.g. {example!r}")


@dataclass(frozen=True)
class Metric:
    """One figure an evaluation reports: ``fn(model, batch)`` is its mean over the batch's
    samples (a scalar tensor or float), weighted by the batch's sample count to give the mean over
    the whole evaluation set; ``higher_is_better`` is its direction (accuracy: True, an error:
    False), which targets, searches and reports read (a metric without one is refused)."""

    name: str
    # Any, not nn.Module: in evaluation the model comes wrapped so that it runs once per input
    # for the loss and every metric (training/loop/evaluate.py, _Once); it calls and passes
    # attributes through like the module
    fn: Callable[[Any, Any], torch.Tensor | float]
    higher_is_better: bool | None = None


@dataclass
class Task:
    """A training job: data, model, loss, metrics, optimizer and the unit of its throughput.

    - ``train_data``, ``eval_data``: map-style ``torch.utils.data.Dataset`` objects (``len`` and
      ``[i]``); items are tensors, tuples or dicts of tensors, batched by ``collate`` (default:
      ``torch.utils.data.default_collate``). ``--val-fraction`` holds part of ``train_data``
      out; ``eval_data`` is the held-out evaluation (test) set. The same on every rank.
    - ``model``: a factory, called with no arguments, returning the ``nn.Module`` to train.
    - ``loss(model, batch)``: the training loss, a finite scalar tensor (the mean over the
      batch's samples), computed from the model and one batch already on the device.
    - ``metrics``: the evaluation's figures beside the loss, each a :class:`Metric`;
      ``judge`` names the one that judges the run (default: the first metric, else the loss).
    - ``unit``, ``units_per_sample``: what throughput is counted in (``"samples"``, 1; or
      ``"tokens"``, the tokens in one sample).
    - ``optimizer(params, lr)``: optional factory; without it ``--optimizer`` (sgd or adamw)
      with ``--momentum`` and ``--weight-decay`` decides. parascale sets the learning rate of
      every parameter group at every step (``--lr`` with its scaling, warm-up and schedule).
    """

    train_data: Any
    eval_data: Any
    model: Callable[[], nn.Module]
    loss: Callable[[Any, Any], torch.Tensor]
    metrics: list[Metric] = field(default_factory=list)
    judge: str | None = None
    unit: str = "samples"
    units_per_sample: float = 1.0
    collate: Callable[[list], Any] | None = None
    optimizer: Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer] | None = None
    name: str = "task"
    """A short name for banners and reports (the built-in family: 'smallcnn on digits')."""

    def judged_by(self) -> Metric:
        """The metric that judges the run (the loss is a metric too, lower is better)."""
        wanted = self.judge or (self.metrics[0].name if self.metrics else LOSS)
        return self.metric(wanted)

    def metric(self, name: str) -> Metric:
        for m in self.all_metrics():
            if m.name == name:
                return m
        raise KeyError(name)

    def all_metrics(self) -> list[Metric]:
        """The loss first, then the task's own metrics."""
        return [Metric(LOSS, self.loss, False), *self.metrics]

    def directions(self) -> dict[str, bool | None]:
        """Each metric's direction by name (higher is better), the loss first."""
        return {m.name: m.higher_is_better for m in self.all_metrics()}

    def throughput_unit(self) -> Unit:
        """What the record counts throughput in, and its per-unit figures (tokens: perplexity)."""
        return Unit(self.unit, self.units_per_sample)

    def section(self) -> dict[str, Any]:
        """What the run record says about the task (``task`` in docs/record.md)."""
        return task_section(self.name, self.throughput_unit(), self.directions(),
                            self.judged_by().name)


def build_optimizer(task: Task, optim: OptimConfig,
                    params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The task's own optimizer, or ``--optimizer`` with its settings."""
    params = list(params)
    if task.optimizer is not None:
        return task.optimizer(params, optim.lr)
    kernel = implementation(params)
    if optim.optimizer == "adamw":
        # decay the weight matrices and embeddings only, not gains and biases (GPT-2, nanoGPT)
        groups: list[dict[str, Any]] = [
            {"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=optim.lr,
                                 betas=(0.9, optim.adam_beta2), weight_decay=optim.weight_decay,
                                 **kernel)
    return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum,
                           weight_decay=optim.weight_decay, **kernel)


def implementation(params: list[nn.Parameter]) -> dict[str, bool]:
    """How the built-in optimizers update: on CUDA torch's fused kernel (a few launches for
    every parameter, where the default's multi-tensor form launches one per operation and
    group of tensors); elsewhere torch's default. On the CPU the fused kernel rounds otherwise
    (about 1e-7 apart after a few steps) and the multi-tensor form saves nothing measurable,
    so CPU runs keep the default's numbers."""
    if params and all(p.device.type == "cuda" and torch.is_floating_point(p) for p in params):
        return {"fused": True}
    return {}


def samples_in(batch: Any) -> int:
    """How many samples a batch holds: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for part in batch:
            n = samples_in(part)
            if n:
                return n
    return 0


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it on ``device`` (dicts, lists and tuples)."""
    if isinstance(batch, torch.Tensor):
        return on_device(batch, device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
