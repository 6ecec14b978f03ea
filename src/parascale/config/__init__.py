"""The training configuration: :class:`TrainConfig`, one validated dataclass in sections.

Each section (:mod:`parascale.config.sections`: the job, the data, the processes, the batch, the
optimizer, the strategy, evaluation, measurement, output, checkpoints) documents its fields and
validates itself; :meth:`TrainConfig.validate` runs them and then the checks that span two.
Code reads the section it needs (``cfg.optim.lr``, ``cfg.batch.batch_size``). At the boundaries
the configuration is flat: the command line's flags, a record's ``config``, a study file and
``parascale.train({...})`` name each setting once by its field's name, in the order of
:data:`NAMES` (:meth:`TrainConfig.from_dict`, :meth:`TrainConfig.to_dict`).

Validation happens in the launching process, before anything is written or any worker starts,
so that bad input costs the user one clear line (exit code 2) and nothing else.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from parascale.checks import is_int
from parascale.config.sections import (
    BACKENDS, DEVICES, LR_SCALINGS, LR_SCHEDULES, OPTIMIZERS, PRECISIONS, SANE, BatchConfig,
    CheckpointConfig, DataConfig, EvaluationConfig, JobConfig, MeasureConfig, OptimConfig,
    OutputConfig, ProcessConfig, Section, StrategyConfig, check_kind, checkpoint_interval,
    kinds_of, profile_steps)
from parascale.errors import UsageError

__all__ = [
    "BACKENDS", "DEVICES", "LR_SCALINGS", "LR_SCHEDULES", "NAMES", "NOT_WITH_TASK", "OPTIMIZERS",
    "PRECISIONS", "SANE", "SECTIONS", "TUPLE_FIELDS", "BatchConfig", "CheckpointConfig",
    "DataConfig", "EvaluationConfig", "JobConfig", "MeasureConfig", "OptimConfig",
    "OutputConfig", "ProcessConfig", "StrategyConfig", "TrainConfig", "check_run_folder",
    "check_type", "checkpoint_interval", "field_kinds", "profile_steps",
]

TUPLE_FIELDS = ("synthetic_shape", "gpus", "lr_milestones")
#: the built-in model and data options, which a --task (its own model and data) does not take
NOT_WITH_TASK = ("model", "dataset", "context", "gpt_layers", "gpt_heads", "gpt_width",
                 "data_dir", "download", "image_size", "synthetic_shape", "synthetic_size",
                 "num_classes", "augment", "verify_data")

#: Every setting's name, in the order a record's ``config`` and ``to_dict`` list them (the
#: order of the one flat dataclass this was until the sections: records keep it, key for key).
NAMES = (
    "task", "model", "dataset", "context", "gpt_layers", "gpt_heads", "gpt_width", "data_dir",
    "download", "image_size", "synthetic_shape", "synthetic_size", "num_classes", "augment",
    "verify_data", "workers", "gpus", "device", "backend", "threads", "oversubscribe",
    "device_memory", "batch_size", "global_batch", "accumulate", "epochs", "steps", "lr",
    "lr_scaling", "base_batch", "warmup_epochs", "warmup_steps", "lr_schedule", "lr_milestones",
    "lr_gamma", "lr_min", "optimizer", "momentum", "weight_decay", "clip_grad_norm",
    "adam_beta2", "seed", "val_fraction", "evaluate_test", "precision", "sync_batchnorm",
    "loader_workers", "compile", "peak_tflops", "sync", "sync_options", "target_accuracy",
    "target_metric", "target_value", "stop_at_target", "eval_every", "eval_batches",
    "noise_scale", "profile",
    "port", "timeout", "max_restarts", "out", "save_model", "tensorboard", "checkpoint_every",
    "keep", "resume",
)


@dataclass
class TrainConfig:
    """Everything one training run needs, in sections; each field of a section is a setting
    whose name is its command-line option (``lr`` is ``--lr``), unique across the sections."""

    job: JobConfig = field(default_factory=JobConfig)
    data: DataConfig = field(default_factory=DataConfig)
    processes: ProcessConfig = field(default_factory=ProcessConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    @classmethod
    def of(cls, **settings: Any) -> TrainConfig:
        """The configuration with these settings, each named flat (``TrainConfig.of(lr=0.1,
        workers=2)``) and placed in its section, the others at their defaults. Nothing is
        checked (:meth:`validate` does); a name that is no setting is a TypeError, as a
        constructor's unknown keyword is. A dict from outside goes through :meth:`from_dict`."""
        return cls().replace(**settings)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with these settings changed, named flat (``cfg.replace(workers=2, out=...)``);
        every section is copied, so that settling the copy in place leaves ``self`` alone."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for name, value in changes.items():
            if name not in SECTION_OF:
                close = difflib.get_close_matches(name, NAMES, n=1)
                raise TypeError(f"TrainConfig has no setting {name!r}"
                                + (f"; did you mean {close[0]}?" if close else ""))
            parts[SECTION_OF[name]][name] = value
        return TrainConfig(
            job=dataclasses.replace(self.job, **parts["job"]),
            data=dataclasses.replace(self.data, **parts["data"]),
            processes=dataclasses.replace(self.processes, **parts["processes"]),
            batch=dataclasses.replace(self.batch, **parts["batch"]),
            optim=dataclasses.replace(self.optim, **parts["optim"]),
            strategy=dataclasses.replace(self.strategy, **parts["strategy"]),
            evaluation=dataclasses.replace(self.evaluation, **parts["evaluation"]),
            measure=dataclasses.replace(self.measure, **parts["measure"]),
            output=dataclasses.replace(self.output, **parts["output"]),
            checkpoint=dataclasses.replace(self.checkpoint, **parts["checkpoint"]))

    def value(self, name: str) -> Any:
        """The setting ``name`` (``lr``), for code that walks the settings by name (the flags,
        the keys of a dict); code that knows the setting reads its section (``cfg.optim.lr``)."""
        return getattr(getattr(self, SECTION_OF[name]), name)

    def sections(self) -> tuple[Section, ...]:
        return (self.job, self.data, self.processes, self.batch, self.optim, self.strategy,
                self.evaluation, self.measure, self.output, self.checkpoint)

    def validate(self) -> None:
        """Each section alone, in order, then the checks that span two sections; not the
        strategies' options, which :func:`parascale.validation.validate` checks after these
        (a caller wants that one: the strategies sit above this module)."""
        for section in self.sections():
            section.validate()
        if not self.evaluation.evaluate_test and not self.data.val_fraction:
            raise UsageError("--no-evaluate-test needs a validation split to evaluate instead, "
                             "e.g. --val-fraction 0.2")
        if self.job.task is not None:
            default = TrainConfig()
            for name in NOT_WITH_TASK:  # ignored beside a task, while the record would say them
                if self.value(name) != default.value(name):
                    raise UsageError(f"--{name.replace('_', '-')} does not apply with --task, "
                                     "which brings its own model and data: leave it out")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a flat dict in the order of :data:`NAMES`, each strategy option a key
        of its own where ``sync_options`` stands (as records and study files name them)."""
        data: dict[str, Any] = {}
        for name in NAMES:
            value = self.value(name)
            if name == "sync_options":
                data.update(copy.deepcopy(value))
            elif name in TUPLE_FIELDS and value is not None:
                data[name] = list(value)
            else:
                data[name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The configuration of a dict of settings (``parascale.train({...})``, a study's run, a
        record's ``config``), each checked against its type. A key that is no setting is a
        strategy's option, as is each entry of a ``sync_options`` mapping; the strategies'
        registry checks them (:func:`parascale.validation.validate`), since this module sits
        below it."""
        given = {name: value for name, value in data.items() if name in SECTION_OF}
        extra = {name: value for name, value in data.items() if name not in SECTION_OF}
        for name, value in given.items():
            check_type(name, value)  # as given, before the conversions below
            kind, _ = field_kinds()[name]
            if typing.get_origin(kind) is tuple and isinstance(value, list):
                given[name] = tuple(value)  # JSON and YAML give lists
            elif kind is float and is_int(value):
                given[name] = float(value)
        nested = given.get("sync_options") or {}
        twice = sorted(k for k in set(nested) & set(extra) if nested[k] != extra[k])
        if twice:
            raise UsageError(f"{twice[0]} is given twice, as {extra[twice[0]]!r} and in "
                             f"sync_options as {nested[twice[0]]!r}; give it once")
        given["sync_options"] = {**nested, **extra}
        return cls.of(**given)


#: The sections by their name in :class:`TrainConfig`, in its order.
SECTIONS: dict[str, type[Section]] = typing.get_type_hints(TrainConfig)
#: Each setting's section.
SECTION_OF = {f.name: name for name, kind in SECTIONS.items() for f in fields(kind)}


@functools.cache
def field_kinds() -> dict[str, tuple[Any, bool]]:
    """Each setting's type from its annotation, and whether it may be None, in :data:`NAMES`'
    order."""
    kinds = {name: kind for section in SECTIONS.values() for name, kind in
             kinds_of(section).items()}
    return {name: kinds[name] for name in NAMES}


def check_type(name: str, value: Any) -> None:
    """``value`` against setting ``name``'s annotation."""
    check_kind(name, value, *field_kinds()[name])


def check_run_folder(cfg: TrainConfig) -> None:
    """Checked when a run starts rather than in :meth:`TrainConfig.validate` (a study's
    configurations get their folders later): checkpoints and traces need a folder to live in."""
    for name, value in (("checkpoint_every", cfg.checkpoint.checkpoint_every),
                        ("resume", cfg.checkpoint.resume)):
        if value not in (None, False) and not cfg.output.out:
            raise UsageError(f"--{name.replace('_', '-')} needs --out: checkpoints live in "
                             "DIR/checkpoints, the folder of the run")
    if cfg.measure.profile is not None and not cfg.output.out:
        raise UsageError("--profile needs --out: the traces are written into DIR/traces, next "
                         "to the run's record")
