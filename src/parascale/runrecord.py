"""The run record as types, and the one builder of every run record (docs/record.md).

:mod:`parascale.record` is the contract (schema, file names, reading and writing); this module
is what a run fills in. An epoch's entry is an :class:`EpochEntry`, the record a :class:`Record`,
made by :func:`finished` (a run that trained) or :func:`failed` (one that did not), and
:meth:`Record.to_dict` is the one way out: the dict that ``record.write`` and the launcher's
staging write as strict JSON. What the record derives from its own figures is derived there,
once: the summary's last evaluation from the epochs, the FLOP figures from the ``flops``
section, and the per-token figures from the task's unit alone (``tokens``: throughput in tokens,
perplexity from each loss). ``parascale train`` and ``parascale run`` both build their records
here; :func:`launched` adds what only the launcher knows (its times, restarts and ``--out``).

Like ``record.py`` it imports nothing of torch, so every layer can use it.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from parascale import record as rec

TOKENS = "tokens"
STEP_SPLIT = "step_split_s"  # the epoch entry's mean step time by part
SPLITS = ("test_", "val_")  # an evaluation's figure is <split>_<metric>: test_loss, val_mae
#: an entry's figures from the gradient noise scale (training/observe/noise.py), as it gives them
NOISE = ("noise_scale", "noise_scale_se", "grad_sq", "trace_sigma", "noise_steps", "noise_note")
#: an entry's per-token figures: derived from its own on the way out, never kept
PER_TOKEN = ("tokens_per_s", "test_perplexity", "val_perplexity")


def perplexity(loss: float) -> float:
    """e ** the mean loss per token in nats (capped where exp would overflow a float)."""
    return math.exp(min(loss, 700.0))


@dataclass(frozen=True)
class Unit:
    """What throughput is counted in (a task's ``unit``) and how many of it are in a sample."""

    name: str = "samples"
    per_sample: float = 1.0

    @classmethod
    def of(cls, task: Mapping[str, Any] | None) -> Unit:
        """The unit a record's ``task`` section declares (samples for records without one)."""
        if not task:
            return SAMPLES
        return cls(str(task.get("unit", "samples")), float(task.get("units_per_sample", 1.0)))

    def per_sample_figure(self) -> int | float:
        """``derived.tokens_per_sample``: an integer when it is one (a context of T tokens)."""
        return int(self.per_sample) if float(self.per_sample).is_integer() else self.per_sample

    def entry_figures(self, throughput: float | None,
                      metrics: Mapping[str, float | None]) -> dict[str, float]:
        """An epoch's figures in tokens: throughput, and the perplexity of each loss."""
        if self.name != TOKENS:
            return {}
        out = {}
        if throughput is not None:
            out["tokens_per_s"] = throughput * self.per_sample
        for split in ("test", "val"):
            if (loss := metrics.get(f"{split}_loss")) is not None:
                out[f"{split}_perplexity"] = perplexity(loss)
        return out

    def summary_figures(self, steady_throughput: float | None,
                        final_test_loss: float | None) -> dict[str, float]:
        """The summary's figures in tokens: steady throughput, the last test perplexity."""
        if self.name != TOKENS:
            return {}
        out = {}
        if steady_throughput is not None:
            out["steady_tokens_per_s"] = steady_throughput * self.per_sample
        if final_test_loss is not None:
            out["final_test_perplexity"] = perplexity(final_test_loss)
        return out


SAMPLES = Unit()


def task_section(name: str, unit: Unit, metrics: Mapping[str, bool | None],
                 judge: str) -> dict[str, Any]:
    """The record's ``task``: its name, unit, every metric with its direction (the loss
    first) and the metric that judges the run."""
    return {"name": name, "unit": unit.name, "units_per_sample": unit.per_sample,
            "metrics": [{"name": m, "higher_is_better": higher} for m, higher in metrics.items()],
            "judge": judge}


@dataclass
class EpochEntry:
    """One finished epoch, as the record's ``epochs`` list holds it (docs/record.md)."""

    epoch: int
    warmup: bool
    steps: int
    partial: bool
    wall_time_s: float  # the slowest rank's
    wall_time_s_per_rank: list[float]
    cpu_time_s_per_rank: list[float]
    samples: int  # every rank's
    throughput: float | None
    train_loss: float | None  # None: a script that called loss.backward() itself
    lr: float
    other_cores: float | None
    steal_cores: float | None
    step_split_s: dict[str, float] | None
    noise: dict[str, Any] = field(default_factory=dict)  # the noise scale's figures (NOISE)
    profiled: bool = False  # held --profile's steps: left out of the steady figures
    resumed: bool = False  # the epoch a resumed run continued in
    #: the evaluation's figures by <split>_<metric> (test_loss, val_accuracy, test_mae)
    metrics: dict[str, float | None] = field(default_factory=dict)
    #: what each split's evaluation covered, by split: {"test": {"samples", "of", "seed"}}
    evaluation: dict[str, dict[str, Any]] = field(default_factory=dict)
    elapsed_s: float | None = None  # training time at the end of its evaluation
    unit: Unit = field(default=SAMPLES, compare=False, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)  # keys of another version, kept

    def evaluated(self) -> bool:
        """Whether any figure of an evaluation is in it (a script's may have no loss)."""
        return any(value is not None for value in self.metrics.values())

    def to_dict(self, unit: Unit | None = None) -> dict[str, Any]:
        """The entry as the record writes it (and --tensorboard shows it), its per-token
        figures in ``unit`` (the record's task's; by default the one it was made with)."""
        metrics = self.metrics
        out: dict[str, Any] = {
            "epoch": self.epoch, "warmup": self.warmup, "steps": self.steps,
            "partial": self.partial, "wall_time_s": self.wall_time_s,
            "wall_time_s_per_rank": self.wall_time_s_per_rank,
            "cpu_time_s_per_rank": self.cpu_time_s_per_rank, "samples": self.samples,
            "throughput": self.throughput, "train_loss": self.train_loss,
            "test_loss": metrics.get("test_loss"), "test_accuracy": metrics.get("test_accuracy"),
            "lr": self.lr, "other_cores": self.other_cores, "steal_cores": self.steal_cores,
            STEP_SPLIT: self.step_split_s, **self.noise}
        if self.profiled:
            out["profiled"] = True
        if self.resumed:
            out["resumed"] = True
        out.update((k, v) for k, v in metrics.items() if k not in ("test_loss", "test_accuracy"))
        out.update((unit or self.unit).entry_figures(self.throughput, metrics))
        out.update(self.extra)
        if self.evaluation:
            out["evaluation"] = self.evaluation
        out["elapsed_s"] = self.elapsed_s
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], unit: Unit = SAMPLES) -> EpochEntry:
        """An entry as :meth:`to_dict` wrote it (a checkpoint keeps them so); the per-token
        figures are derived again from ``unit``."""
        known = {"epoch", "warmup", "steps", "partial", "wall_time_s", "wall_time_s_per_rank",
                 "cpu_time_s_per_rank", "samples", "throughput", "train_loss", "lr",
                 "other_cores", "steal_cores", STEP_SPLIT, "profiled", "resumed", "elapsed_s",
                 "evaluation"}
        # test_loss and test_accuracy are written whether evaluated or not: None is no figure
        metrics = {k: v for k, v in data.items() if k.startswith(SPLITS) and k not in PER_TOKEN
                   and not (v is None and k in ("test_loss", "test_accuracy"))}
        extra = {k: v for k, v in data.items() if k not in known and not k.startswith(SPLITS)
                 and k not in NOISE and k not in PER_TOKEN}
        return cls(
            epoch=data["epoch"], warmup=data["warmup"], steps=data["steps"],
            partial=data["partial"], wall_time_s=data["wall_time_s"],
            wall_time_s_per_rank=list(data.get("wall_time_s_per_rank") or []),
            cpu_time_s_per_rank=list(data.get("cpu_time_s_per_rank") or []),
            samples=data["samples"], throughput=data.get("throughput"),
            train_loss=data.get("train_loss"), lr=data.get("lr", 0.0),
            other_cores=data.get("other_cores"), steal_cores=data.get("steal_cores"),
            step_split_s=data.get(STEP_SPLIT), noise={k: data[k] for k in NOISE if k in data},
            profiled=bool(data.get("profiled")), resumed=bool(data.get("resumed")),
            metrics=metrics, evaluation=dict(data.get("evaluation") or {}),
            elapsed_s=data.get("elapsed_s"), unit=unit, extra=extra)


@dataclass
class RunSummary:
    """The summary's measured figures; the rest of it is derived by :meth:`Record.to_dict`."""

    setup_time_s: float  # worker start to the first step
    total_time_s: float  # the run's training time (earlier attempts' up to a resume included)
    steady: dict[str, Any]  # training.observe.measure.steady_figures: steady epoch time, throughput


@dataclass
class Record:
    """A run record: made by :func:`finished` or :func:`failed`, written by :meth:`to_dict`.

    The sections that other parts of parascale measure (steps, memory, machine, sync, flops,
    noise, checkpoints...) are kept as those parts give them (docs/record.md)."""

    status: str
    config: dict[str, Any]
    derived: dict[str, Any] | None
    reason: str | None = None
    detail: str | None = None  # a failure's traceback
    task: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    epochs: list[EpochEntry] = field(default_factory=list)
    steps: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    time_to_accuracy: dict[str, Any] | None = None
    sync: dict[str, Any] | None = None
    machine: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None
    resumed: list[dict[str, Any]] | None = None
    restarts: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    noise: dict[str, Any] | None = None
    flops: dict[str, Any] | None = None
    summary: RunSummary | None = None  # None: the run did not finish
    study: dict[str, Any] | None = None
    search: dict[str, Any] | None = None  # a search trial's
    script: dict[str, Any] | None = None  # parascale run's: the script and its arguments

    @property
    def unit(self) -> Unit:
        return Unit.of(self.task)

    def to_dict(self) -> dict[str, Any]:
        """The record as it is written, in the order docs/record.md shows; non-finite figures
        are left for :func:`parascale.safejson.dumps` (the writer) to say."""
        ran = self.summary is not None
        unit = self.unit
        derived = self.derived
        if ran and derived is not None and unit.name == TOKENS:
            derived = {**derived, "tokens_per_sample": unit.per_sample_figure()}
        out: dict[str, Any] = {"schema": rec.SCHEMA, "status": self.status,
                               "reason": self.reason, "detail": self.detail,
                               "config": self.config, "derived": derived}
        if ran:
            out["task"] = self.task
        out.update({
            "environment": self.environment,
            "epochs": [e.to_dict(unit) for e in self.epochs], "steps": self.steps,
            "memory": self.memory, "time_to_accuracy": self.time_to_accuracy,
            "sync": self.sync, "machine": self.machine, "timing": self.timing,
            "resumed": self.resumed, "restarts": self.restarts,
            "checkpoints": self.checkpoints, "profile": self.profile, "noise": self.noise})
        if ran:
            out["flops"] = self.flops
        out["summary"] = self._summary(out["epochs"]) if ran else None
        out["study"] = self.study
        if self.search is not None:
            out["search"] = self.search
        if self.script is not None:
            out["script"] = self.script
        return out

    def _summary(self, written: list[dict[str, Any]]) -> dict[str, Any]:
        """The summary: what was measured, then what follows from the epochs (``written``:
        their entries as written), the ``flops`` section and the unit."""
        assert self.summary is not None
        measured = self.summary
        done = [i for i, e in enumerate(self.epochs) if e.evaluated()]
        last = written[done[-1]] if done else None  # the last evaluation, as written
        out: dict[str, Any] = {
            "setup_time_s": measured.setup_time_s, "total_time_s": measured.total_time_s,
            **measured.steady, "warmup_included": all(e.warmup for e in self.epochs),
            "final_test_accuracy": last.get("test_accuracy") if last else None,
            "final_test_loss": last.get("test_loss") if last else None}
        if last is not None and "val_accuracy" in last:
            out["final_val_accuracy"] = last["val_accuracy"]
        out["final_train_loss"] = self.epochs[-1].train_loss if self.epochs else None
        # every figure of the last evaluation, by its entry key (test_loss, val_mae...)
        out["final_metrics"] = {k: v for k, v in last.items()
                                if k.startswith(SPLITS) and v is not None} if last else {}
        if self.flops:
            out.update({k: self.flops.get(k) for k in ("flops_per_step", "achieved_flops", "mfu")})
        out.update(self.unit.summary_figures(out.get("steady_throughput"),
                                             out["final_test_loss"]))
        return out


def finished(*, config: dict[str, Any], derived: dict[str, Any], task: dict[str, Any],
             environment: dict[str, Any], epochs: list[EpochEntry], steps: dict[str, Any],
             memory: dict[str, Any], time_to_accuracy: dict[str, Any] | None,
             sync: dict[str, Any] | None, machine: dict[str, Any] | None,
             timing: dict[str, Any] | None, continuity: dict[str, Any],
             flops: dict[str, Any] | None, summary: RunSummary,
             search: dict[str, Any] | None = None,
             script: dict[str, Any] | None = None) -> Record:
    """The record of a run that trained, from plain figures: gathered from every rank by
    ``training.record.assemble`` (for ``train`` and ``run`` alike). ``continuity``: the
    ``resumed``, ``restarts``, ``checkpoints``, ``profile`` and ``noise`` sections."""
    return Record(
        status="ok", config=config, derived=derived, task=task, environment=environment,
        epochs=epochs, steps=steps, memory=memory, time_to_accuracy=time_to_accuracy,
        sync=sync, machine=machine, timing=timing, resumed=continuity.get("resumed"),
        restarts=list(continuity.get("restarts") or []),
        checkpoints=continuity.get("checkpoints"), profile=continuity.get("profile"),
        noise=continuity.get("noise"), flops=flops, summary=summary, search=search,
        script=script)


def failed(config: dict[str, Any], status: str, reason: str, derived: dict[str, Any] | None,
           environment: dict[str, Any] | None = None, detail: str | None = None, *,
           restarts: list[dict[str, Any]] | None = None,
           resumed: list[dict[str, Any]] | None = None,
           script: dict[str, Any] | None = None) -> Record:
    """A record for a run that did not finish: never claims success, always says why.

    ``detail`` is the failing rank's traceback: the user sees the one-line ``reason``, and
    whoever needs more finds it here."""
    return Record(status=status, config=config, derived=derived, reason=reason, detail=detail,
                  environment=environment, restarts=list(restarts or []), resumed=resumed,
                  script=script)


def command_timing(worker: Mapping[str, Any], since: tuple[str, float]) -> dict[str, Any]:
    """The record's ``timing``: the command's own times around the training window that rank
    0 measured (``worker``: its ``first_step_at`` and ``training_s``), from ``since`` (a label
    and a ``time.time()``)."""
    label, start = since
    command = time.time() - start
    startup = worker["first_step_at"] - start
    return {"command_s": command, "startup_s": startup, "training_s": worker["training_s"],
            "finish_s": command - startup - worker["training_s"],
            "first_step_at": worker["first_step_at"], "since": label}


def launched(record: dict[str, Any], *, out: str | None, since: tuple[str, float],
             restarts: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's record (as read from its file) with what only the local launcher knows: the
    ``--out`` the user gave, the command's timing and the restarts it made."""
    return {**record, "config": {**record["config"], "out": out},
            "timing": command_timing(record["timing"], since), "restarts": restarts}
