"""The search loop: ask Optuna for a trial, start it on a free slot, record how it ended.

Each trial is a process of its own (:mod:`.trial`) training into ``OUT/trials/NNNN/`` with its
console output in ``log.txt`` there. The trial's rank 0 reports each epoch's validation accuracy
to the study itself (:mod:`parascale.training.loop.pruning`); this loop tells the study how the
trial ended, from its run record: complete (the objective), pruned, or failed (the reason).
Ctrl-C or SIGTERM stops the trials, marks them interrupted and queues their parameters again
(:func:`.study.interrupt`).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from parascale import safejson
from parascale.hpo import objective as objectives
from parascale.hpo import study as studies
from parascale.hpo.slots import Slot
from parascale.hpo.space import Param, config, settings
from parascale.hpo.trial import ERROR_NAME, SPEC_ENV
from parascale.runtime import processes
from parascale.training.loop.pruning import ENV as PRUNER_ENV

POLL_S = 0.2
GRACE_S = 10.0  # an interrupted trial's time to stop its workers (their own grace is 5 s)
MODEL = "model.pt"


@dataclass
class Search:
    """What every trial of one search shares."""

    study: Any
    storage: str
    study_name: str
    space: list[Param]
    fixed: dict[str, Any]  # the training options every trial has
    objective: str  # accuracy | tta | a metric of the task (see hpo/objective.py)
    target: float | None
    pruner: str
    out: Path
    trials: int  # finished trials wanted in the study
    maximize: bool = True  # the objective's direction (tta: False)


@dataclass
class Running:
    trial: Any
    slot: Slot
    folder: Path
    child: processes.Child
    chosen: dict[str, Any]
    started: float = field(default_factory=time.monotonic)


def trial_folder(out: Path, number: int) -> Path:
    return out / "trials" / f"{number:04d}"


def run(search: Search, slots: list[Slot]) -> int:
    """Run trials until the study has ``search.trials`` finished ones; returns how many this
    command finished. Interrupted: stops its trials, queues them again, and re-raises."""
    free, running, done_here = list(slots), [], 0
    finished, _ = studies.counts(search.study)
    bar = tqdm(total=search.trials, initial=min(finished, search.trials), unit="trial",
               desc="trials", mininterval=0.5, disable=None, leave=False)
    try:
        while True:
            finished, active = studies.counts(search.study)
            bar.n = min(finished, search.trials)
            bar.refresh()
            while free and finished + active < search.trials:
                running.append(_start(search, free.pop(0)))
                active += 1
            if not running:
                break
            for item in [r for r in running if r.child.poll() is not None]:
                running.remove(item)
                free.append(item.slot)
                bar.write(_conclude(search, item))
                done_here += 1
            time.sleep(POLL_S)
    except BaseException:  # Ctrl-C, SIGTERM, a lost database: stop and leave the study whole
        processes.stop([r.child for r in running], GRACE_S)
        for item in running:
            studies.interrupt(search.study, search.study._storage.get_trial(item.trial._trial_id),
                              "the search was stopped while it ran")
        raise
    finally:
        bar.close()
    return done_here


def _start(search: Search, slot: Slot) -> Running:
    trial = studies.start(search.study, search.storage)
    trial.set_user_attr("slot", slot.label())
    chosen = draw(search.space, search.fixed, trial)
    folder = trial_folder(search.out, trial.number)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config(search.fixed, chosen)
    cfg["out"] = str(folder)
    if cfg.get("tensorboard"):  # each trial its own series, named by the trial's folder
        cfg["tensorboard"] = os.path.join(os.path.abspath(cfg["tensorboard"]), folder.name)
    if slot.gpus is not None:
        cfg["gpus"] = list(slot.gpus)
    else:
        cfg["workers"] = len(slot.cores)
    pruner = {"storage": search.storage, "study": search.study_name, "trial_id": trial._trial_id,
             "number": trial.number, "pruner": search.pruner, "objective": search.objective,
             "metric": objectives.metric(search.objective)}
    env = {**os.environ, SPEC_ENV: safejson.dumps({"config": cfg, "cores": list(slot.cores)}),
           PRUNER_ENV: safejson.dumps(pruner)}
    child = processes.start_module("parascale.hpo.trial", env, folder / "log.txt",
                                   len(slot.cores), f"parascale-t{trial.number}")
    return Running(trial, slot, folder, child, chosen)


def draw(space: list[Param], fixed: dict[str, Any], trial) -> dict[str, Any]:
    """The trial's parameters: drawn by the sampler, or those it already holds (a retry's, or
    those drawn before its search was killed)."""
    return settings(space, fixed, lambda p: p.suggest(trial))


def _conclude(search: Search, item: Running) -> str:
    """Tell the study how the trial ended; the line that says so."""
    from optuna.trial import TrialState

    trial, folder = item.trial, item.folder
    record = _read(folder / "record.json")
    shown = ", ".join(f"{k}={_short(v)}" for k, v in item.chosen.items())
    head = f"trial {trial.number} ({shown}) on {item.slot.label()}"
    if record is not None and record.get("status") == "ok":
        facts = facts_of(record, search.objective, search.maximize)
        for key, value in facts.items():
            trial.set_user_attr(key, value)
        pruned = (record.get("search") or {}).get("pruned_at_epoch")
        if pruned:
            search.study.tell(trial, state=TrialState.PRUNED)
            (folder / MODEL).unlink(missing_ok=True)
            seen = objectives.best_of(record, search.objective, search.maximize)
            return f"{head}: pruned after epoch {pruned} " \
                f"({objectives.describe(objectives.metric(search.objective), seen)})"
        value = objective_value(record, search.objective, search.maximize)
        search.study.tell(trial, value)
        _keep_best_model(search)
        return f"{head}: {describe_value(search.objective, value)} in " \
            f"{facts['training_s']:.1f} s"
    reason = _reason(record, folder, item.child.poll())
    trial.set_user_attr("reason", reason)
    search.study.tell(trial, state=TrialState.FAIL)
    (folder / MODEL).unlink(missing_ok=True)
    return f"{head}: failed: {reason}"


def facts_of(record: dict, objective: str = "accuracy", maximize: bool = True) -> dict[str, Any]:
    """What the table and plots show of a trial, kept in the study (its record may be on
    another machine): ``val_best`` is the best validation value of the objective's metric,
    which a task without accuracy has in place of ``val_accuracy``."""
    evaluated = [e["val_accuracy"] for e in record["epochs"] if e.get("val_accuracy") is not None]
    derived = record["derived"]
    peaks = record.get("memory", {}).get("peak_bytes_per_rank") or [None]
    return {"val_accuracy": max(evaluated) if evaluated else None,
            "val_best": objectives.best_of(record, objective, maximize),
            "epochs": len(record["epochs"]), "training_s": record["summary"]["total_time_s"],
            "global_batch": derived["global_batch"],
            "per_device_batch": derived["per_device_batch"],
            "effective_lr": derived["effective_lr"],
            "peak_memory_bytes": max((p for p in peaks if p is not None), default=None),
            "record": str(Path(record["config"]["out"]).resolve() / "record.json")}


def objective_value(record: dict, objective: str, maximize: bool = True) -> float | None:
    """Best validation value of the objective's metric, or seconds to the target (infinite
    when never reached)."""
    return objectives.value_of(record, objective, maximize)


def describe_value(objective: str, value: float | None) -> str:
    return objectives.describe(objective, value)

def _keep_best_model(search: Search) -> None:
    """Only the best trial's model is kept (the one the test set is evaluated on)."""
    try:
        best = search.study.best_trial.number
    except ValueError:  # no complete trial with a value
        return
    from optuna.trial import TrialState

    # only trials the study knows to be over: one that ended a moment ago, not yet told, may
    # be about to become the best
    over = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    for frozen in search.study.get_trials(deepcopy=False, states=over):
        if frozen.number != best:
            (trial_folder(search.out, frozen.number) / MODEL).unlink(missing_ok=True)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _reason(record: dict | None, folder: Path, code: int | None) -> str:
    if record is not None:
        return str(record.get("reason") or record.get("status"))
    error = _read(folder / ERROR_NAME)
    if error:
        return error["reason"]
    tail = processes.tail(folder / "log.txt", "", 3)
    return f"the trial process {processes.exit_text(code)}" + (f"; its last output: {tail}"
                                                              if tail else "")


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
