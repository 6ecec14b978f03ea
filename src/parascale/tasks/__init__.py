"""Tasks: what is trained and how it is judged (see :mod:`.base` and docs/tasks.md).

``prepare(cfg)`` runs in every worker and gives the task and its data as splits the trainer
batches; ``preflight(cfg)`` runs once in the launching process and turns whatever is wrong
with a user's task into one UsageError line before any worker starts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parascale.config import NOT_WITH_TASK, OPTIMIZERS, EvaluationConfig, TrainConfig
from parascale.errors import UsageError
from parascale.tasks.base import (LOSS, NAME_CHARACTERS, Metric, Task, build_optimizer, check_name,
                                   name_problem, samples_in)

if TYPE_CHECKING:
    from parascale.data.split import DataBundle

__all__ = [
    "BUILTIN_METRICS",
    "LOSS",
    "NAME_CHARACTERS",
    "OPTIMIZERS",
    "Metric",
    "Task",
    "build_optimizer",
    "check_name",
    "check_target",
    "config_of_record",
    "directions",
    "name_problem",
    "preflight",
    "prepare",
    "recorded_config",
    "samples_in",
]

#: the built-in classification family's metrics and directions (without building its data)
BUILTIN_METRICS = {LOSS: False, "accuracy": True}


def _user(cfg) -> tuple[Task, DataBundle]:
    from parascale.tasks import load

    task = load.load(cfg.job.task, cfg.job.seed)
    from parascale.data.split import DataBundle, hold_out  # torch: once the task is loaded
    from parascale.tasks.data import DatasetSplit

    if task.name == "task":
        task.name = cfg.job.task
    bundle = DataBundle(name=task.name, train=DatasetSplit(task.train_data, task.collate),
                        test=DatasetSplit(task.eval_data, task.collate), num_classes=0,
                        input_shape=(0, 0, 0))
    return task, hold_out(bundle, cfg.data.val_fraction, cfg.job.seed)


def prepare(cfg) -> tuple[Task, DataBundle]:
    """The run's task and its data (validation held out): the user's, or the built-in
    classification of ``cfg.job.model`` on ``cfg.data.dataset``."""
    if cfg.job.task is None:
        from parascale.tasks.builtin import classification

        return classification(cfg)
    return _user(cfg)


def preflight(cfg, workers: int = 1) -> dict[str, Any]:
    """A user's task loaded, checked and tried on two samples, its model asked of the strategy
    on ``workers`` workers; the facts the plan needs."""
    from parascale import sync
    from parascale.tasks import load, tryout

    task, bundle = _user(cfg)
    call = load.call_of(cfg.job.task)
    if len(bundle.train) == 0:  # the whole training set held out
        raise UsageError(f"--val-fraction {cfg.data.val_fraction:g} holds out {len(bundle.val)} "
                         f"of the {len(bundle.val)} samples of train_data, which leaves 0 to train "
                         "on; give a smaller --val-fraction, or more data")
    model = tryout.run(task, call, bundle.train, bundle.test, cfg.optim.lr)
    refused = sync.strategy_of(cfg).refuse_model(cfg, model, workers)
    if refused:
        raise UsageError(f"{call}: {refused}")
    traits = sync.traits_of(cfg.strategy.sync)
    if task.optimizer is not None and traits.optimizer is not None:
        raise UsageError(f"{call}: brings its own optimizer, which --sync {cfg.strategy.sync} "
                         f"cannot use (it {traits.optimizer_why}); leave optimizer out of the "
                         "task")
    directions = {m.name: m.higher_is_better for m in task.all_metrics()}
    check_target(cfg, directions)
    return {"train": len(bundle.train), "test": len(bundle.test),
            "val": len(bundle.val) if bundle.val is not None else 0}


def directions(cfg) -> dict[str, bool]:
    """Each metric of ``cfg``'s task (the loss first) and whether higher is better."""
    if cfg.job.task is None:
        return dict(BUILTIN_METRICS)
    from parascale.tasks import load

    task = load.load(cfg.job.task, cfg.job.seed)
    return {m.name: m.higher_is_better for m in task.all_metrics()}


def target_of(evaluation: EvaluationConfig) -> tuple[str, float] | None:
    """The metric and value of time-to-target: ``--target-metric/--target-value``, or
    ``--target-accuracy``; None without a target."""
    if evaluation.target_metric is not None:
        return evaluation.target_metric, evaluation.target_value
    if evaluation.target_accuracy is not None:
        return "accuracy", evaluation.target_accuracy
    return None


def check_target(cfg, directions: dict[str, bool] | None = None) -> None:
    """A target must name a metric the task has (``directions``: name -> higher is better;
    default the built-in family's)."""
    target = target_of(cfg.evaluation)
    directions = BUILTIN_METRICS if directions is None else directions
    if target is not None and target[0] not in directions:
        given = f"--target-metric {target[0]!r}" if cfg.evaluation.target_metric is not None \
            else "--target-accuracy: 'accuracy'"
        raise UsageError(f"{given} is not a metric of this task; its metrics: "
                         f"{', '.join(directions)}")


def recorded_config(cfg: TrainConfig) -> dict[str, Any]:
    """``cfg`` as a record's ``config`` states it: under ``--task``, the built-in model and data
    options (``config.NOT_WITH_TASK``) null, for the task brought its own model and data and a
    reader must not be told that the defaults (smallcnn on digits) ran. ``task`` names it."""
    settings = cfg.to_dict()
    if cfg.job.task is not None:
        settings.update(dict.fromkeys(NOT_WITH_TASK))
    return settings


def config_of_record(config: dict[str, Any]) -> TrainConfig:
    """The configuration a record's ``config`` states (:func:`recorded_config` undone: a
    task's null built-in options are their defaults again, which it left untouched)."""
    if config.get("task") is not None:
        config = {k: v for k, v in config.items() if k not in NOT_WITH_TASK or v is not None}
    return TrainConfig.from_dict(config)
