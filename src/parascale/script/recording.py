"""A script's run record: the trainer's (training/record/assemble.py, parascale/runrecord.py), from
what the script's run measured, so that ``report``, ``predict`` and time-to-target read it as
any other. The script is no task of parascale's: its ``task`` section names the metrics it
logged, each with the direction it gave."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from parascale import runrecord, tasks
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.runtime import World
from parascale.sync.base import Strategy
from parascale.training.record.assemble import assemble
from parascale.training.observe.contention import CpuWatch
from parascale.training.record.target import time_to_target
from parascale.training.record.progress import Progress
from parascale.training.record.summary import Summary, Times, steady

NOT_MEASURED = "parascale run does not measure a script's gradient noise scale"


@dataclass
class Measured:
    """What one copy of the script measured (script/api.py's run hands it over at the end)."""

    cfg: TrainConfig
    world: World
    name: str  # the script's file name: the record's model
    args: list[str]
    plan: Plan
    strategy: Strategy
    progress: Progress
    cpu: CpuWatch
    directions: dict[str, bool]  # every metric it logged: whether higher is better
    lr: float  # the optimizer's rate at the end
    started: str  # when the run started (ISO time)
    setup_s: float  # start() to the first step
    first_step_at: float | None


def _metrics(run: Measured) -> dict[str, bool | None]:
    """The loss (lower is better, whether logged or not), then each metric the script logged."""
    return {tasks.LOSS: False, **{name: higher for name, higher in run.directions.items()
                                  if name != tasks.LOSS}}


def _task(run: Measured) -> dict[str, Any]:
    """The record's ``task``: judged by accuracy when logged, else by the first metric logged."""
    metrics = _metrics(run)
    logged = [name for name in metrics if name != tasks.LOSS]
    judge = "accuracy" if "accuracy" in logged else (logged[0] if logged else tasks.LOSS)
    return runrecord.task_section(run.name, runrecord.SAMPLES, metrics, judge)


def _time_to_target(run: Measured) -> dict[str, Any] | None:
    """The record's ``time_to_accuracy`` over the epochs the script logged; a target on a
    metric it never logged is never reached, and rank 0 says why."""
    target = tasks.target_of(run.cfg.evaluation)
    if target is None:
        return None
    if target[0] not in run.directions:
        if run.world.is_main:
            print(f"parascale: the target on {target[0]} was never reached: the script never "
                  f"logged {target[0]} (run.log({target[0]}=...))", flush=True)
        return {"target": target[1], "metric": target[0], "higher_is_better": None,
                "reached": False, "split": "test", "epoch": None, "elapsed_s": None}
    tta = None
    directions = _metrics(run)
    for entry in run.progress.epochs:
        tta = time_to_target(run.cfg.evaluation, directions, entry, tta)
    return tta


def make_record(run: Measured) -> dict[str, Any] | None:
    """Collective: every rank gathers its figures; rank 0 writes record.json (and model.pt)
    into the run's --out and returns the record."""
    progress, strategy = run.progress, run.strategy
    epochs = progress.epochs
    plan = dataclasses.replace(
        run.plan, derived=dataclasses.replace(run.plan.derived, effective_lr=run.lr),
        epochs=len(epochs), total_steps=progress.step)
    strategy.finish()
    ended = time.perf_counter()
    tta = _time_to_target(run)
    times = Times(setup_s=run.setup_s, total_s=ended - progress.t_start, start=run.started,
                  training_s=ended - progress.t_start, first_step_at=run.first_step_at or 0.0)
    continuity = {"resumed": None, "restarts": [], "checkpoints": None, "profile": None,
                  "noise": {"measured": False, "reason": NOT_MEASURED,
                            "per_device_batch": plan.derived.per_device_batch,
                            "global_batch": plan.derived.global_batch, "noise_scale": None,
                            "noise_scale_se": None, "epoch": None, "steps": None,
                            "advice": None}}
    # the record's configuration: the script's own batch, length and rate, as measured
    cfg = run.cfg.replace(batch_size=plan.derived.per_device_batch,
                          global_batch=plan.derived.global_batch, epochs=len(epochs),
                          lr=run.lr, model=run.name, dataset="script",
                          save_model=bool(run.cfg.output.out))
    kept = steady(progress, plan.steps_per_epoch, len(epochs))
    return assemble(cfg, run.world, plan, strategy, Summary(
        epochs, kept, tta, times, run.cpu.end_window(), None, continuity, task=_task(run)),
        script={"path": run.name, "args": list(run.args)})
