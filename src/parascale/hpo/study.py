"""The Optuna study in its database, what identifies a search, and trials a search left behind.

A search is resumed or extended by running the same command again: the study is loaded from its
storage, and must have been created for the same search (objective, space, fixed options), or
its trials would answer a different question. A trial still marked running whose search process
is gone (killed, the machine rebooted) is marked failed as interrupted and its parameters are
queued again, so that no trial is lost and none that finished runs twice.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from parascale.errors import UsageError
from parascale.hpo.judge import make_pruner, open_storage

INTERRUPTED = "interrupted"  # user attribute of a trial whose search ended while it ran
OWNER = "owner"  # user attribute: which search process runs the trial


def open_study(url: str, name: str, identity: dict[str, Any], seed: int, pruner: str):
    """Create the study, or load it and check that it is the same search."""
    import optuna
    import sqlalchemy.exc

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    direction = "maximize" if identity["objective"] == "accuracy" else "minimize"
    try:
        study = optuna.create_study(storage=open_storage(url), study_name=name,
                                    direction=direction, pruner=make_pruner(pruner),
                                    load_if_exists=True)
        stored = study.user_attrs.get("parascale")
        if stored is None:
            study.set_user_attr("parascale", identity)
        # Seeded by --seed and the trials so far: a resumed or extended search draws new
        # points instead of its first command's again. constant_liar: a running trial counts
        # as a poor result, so trials started together do not draw the same point (Optuna's
        # advice for parallel TPE).
        study.sampler = optuna.samplers.TPESampler(seed=seed * 1_000_003 + len(study.trials),
                                                   constant_liar=True)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot open the search's storage {url!r}: {first}") from None
    if stored is not None and stored != identity:
        differ = [k for k in identity if stored.get(k) != identity[k]]
        raise UsageError(f"study {name!r} in {url} is a different search (its "
                         f"{', '.join(differ) or 'settings'} differ); give another "
                         "--study-name or the same options as before")
    return study


def identity(objective: str, target: float | None, space: list, fixed: dict) -> dict[str, Any]:
    """What makes two commands the same search (JSON-comparable)."""
    return json.loads(json.dumps({"objective": objective, "target": target,
                                  "space": [p.to_json() for p in space], "fixed": fixed}))


def owner() -> dict[str, Any]:
    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": psutil.Process().create_time()}


def _alive(who: dict[str, Any]) -> bool:
    """Whether the search process ``who`` still runs (a reused pid has another start time)."""
    import psutil

    if who.get("host") != socket.gethostname():
        return True  # another machine's: not ours to judge
    try:
        return abs(psutil.Process(who["pid"]).create_time() - who["started"]) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError):
        return False


def interrupt(study, frozen, why: str) -> None:
    """Mark a running trial failed as interrupted and queue its parameters again."""
    from optuna.trial import TrialState

    study._storage.set_trial_user_attr(frozen._trial_id, INTERRUPTED, why)
    study.tell(frozen.number, state=TrialState.FAIL)
    study.enqueue_trial(frozen.params, user_attrs={"retry_of": frozen.number})


def recover(study) -> list[int]:
    """Trials left running by a search process of this machine that is gone: interrupted and
    queued again. Their numbers."""
    from optuna.trial import TrialState

    found = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        who = frozen.user_attrs.get(OWNER)
        if who and not _alive(who):
            interrupt(study, frozen, f"its search (pid {who['pid']}) ended at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')} or before")
            found.append(frozen.number)
    return found


def counts(study) -> tuple[int, int]:
    """(finished, running): finished counts complete, pruned and failed trials, but not the
    interrupted, whose parameters run again."""
    from optuna.trial import TrialState

    finished = running = 0
    for frozen in study.get_trials(deepcopy=False):
        if frozen.state == TrialState.RUNNING:
            running += 1
        elif frozen.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
                frozen.state == TrialState.FAIL and INTERRUPTED not in frozen.user_attrs):
            finished += 1
    return finished, running
