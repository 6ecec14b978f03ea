"""A script's run record: the trainer's (training/assemble.py), from what the script's run
measured, so that ``report``, ``predict`` and time-to-target read it as any other."""
from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from parascale import record as rec
from parascale import tasks
from parascale.files import atomic_write_bytes
from parascale.training.assemble import assemble
from parascale.training.judging import time_to_target
from parascale.training.measure import steady
from parascale.training.run import Summary, Times

if TYPE_CHECKING:
    from parascale.script.api import Run

NOT_MEASURED = "parascale run does not measure a script's gradient noise scale"


def _task(run: Run) -> tasks.Task:
    """The script as a task: its name and the metrics it logged, each with its direction."""
    metrics = [tasks.Metric(name, _unused, higher) for name, higher in run.directions.items()
               if name != tasks.LOSS]
    judge = "accuracy" if "accuracy" in run.directions else None
    return tasks.Task(None, None, _unused, _unused, metrics=metrics, judge=judge, name=run.name)


def _unused(*_: Any) -> Any:  # a script builds its own model, loss and metrics
    raise NotImplementedError


def _time_to_target(run: Run, task: tasks.Task) -> dict[str, Any] | None:
    """The record's ``time_to_accuracy`` over the epochs the script logged; a target on a
    metric it never logged is never reached, and rank 0 says why."""
    target = tasks.target_of(run.cfg)
    if target is None:
        return None
    if target[0] not in run.directions:
        if run.is_main:
            print(f"parascale: the target on {target[0]} was never reached: the script never "
                  f"logged {target[0]} (run.log({target[0]}=...))", flush=True)
        return {"target": target[1], "metric": target[0], "higher_is_better": None,
                "reached": False, "split": "test", "epoch": None, "elapsed_s": None}
    tta = None
    for entry in run.progress.epochs:
        tta = time_to_target(run.cfg, task, entry, tta)
    return tta


def make_record(run: Run) -> dict[str, Any] | None:
    """Collective: every rank gathers its figures; rank 0 writes record.json (and model.pt)
    into the run's --out and returns the record."""
    progress, plan, strategy = run.progress, run.plan, run.strategy
    assert plan is not None and strategy is not None
    epochs = progress.epochs
    lr = run.optimizer.param_groups[0]["lr"] if run.optimizer is not None else 0.0
    plan = dataclasses.replace(plan, derived=dataclasses.replace(plan.derived, effective_lr=lr),
                               epochs=len(epochs), total_steps=progress.step)
    strategy.finish()
    ended = time.perf_counter()
    task = _task(run)
    tta = _time_to_target(run, task)
    setup_s = progress.t_start - run.t_called
    times = Times(setup_s=setup_s, total_s=ended - progress.t_start, start=run.started,
                  training_s=ended - progress.t_start, first_step_at=run.first_step_at or 0.0)
    continuity = {"resumed": None, "restarts": [], "checkpoints": None, "profile": None,
                  "noise": {"measured": False, "reason": NOT_MEASURED,
                            "per_device_batch": plan.derived.per_device_batch,
                            "global_batch": plan.derived.global_batch, "noise_scale": None,
                            "noise_scale_se": None, "epoch": None, "steps": None,
                            "advice": None},
                  "flops": None}
    out = run.cfg.out
    cfg = dataclasses.replace(run.cfg, out=None, batch_size=plan.derived.per_device_batch,
                              global_batch=plan.derived.global_batch, epochs=len(epochs),
                              lr=lr, model=run.name, dataset="script", save_model=bool(out))
    kept = steady(progress, plan.steps_per_epoch, len(epochs))
    record = assemble(cfg, run.world, plan, strategy, Summary(
        epochs, kept, tta, times, run.cpu.end_window(), None, continuity, task=task.section()))
    if record is None:
        return None
    _evaluations(record)
    record["config"]["out"] = out
    record["script"] = {"path": run.name, "args": list(run.args)}
    if out:
        buffer = io.BytesIO()
        torch.save(strategy.model_state_dict(), buffer)
        atomic_write_bytes(Path(out, rec.MODEL_NAME), buffer.getvalue())
        rec.write(out, record)
    return record


def _evaluations(record: dict[str, Any]) -> None:
    """The summary's last evaluation, from any metric the script logged (the trainer's
    looks for a loss, which every one of its evaluations has and a script's may not)."""
    logged = [e for e in record["epochs"]
              if any(k.startswith(("test_", "val_")) and e[k] is not None for k in e)]
    if not logged:
        return
    last = logged[-1]
    summary = record["summary"]
    summary["final_metrics"] = {k: v for k, v in last.items()
                                if k.startswith(("test_", "val_")) and v is not None}
    summary["final_test_accuracy"] = last.get("test_accuracy")
    summary["final_test_loss"] = last.get("test_loss")
    if "val_accuracy" in last:
        summary["final_val_accuracy"] = last["val_accuracy"]
