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
from pathlib import Path
from typing import Any, Literal

from parascale import safejson
from parascale.errors import UsageError
from parascale.files import atomic_write_text
from parascale import studydb as storage
from parascale.training.loop.pruning import make_pruner

Direction = Literal["maximize", "minimize"]  # Optuna's words for the objective's way
INTERRUPTED = "interrupted"  # user attribute of a trial whose search ended while it ran
OWNER = "owner"  # user attribute: which search process runs the trial


def open_study(url: str, name: str, identity: dict[str, Any], seed: int, pruner: str,
               elsewhere: str = "another --out"):
    """Create the study, or load it and check that it is the same search. ``elsewhere`` is the
    advice for a different search (where it may go instead)."""
    import optuna
    import sqlalchemy.exc

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # accuracy and tta searches from before any metric could be the objective name none
    maximize = identity.get("maximize", identity["objective"] == "accuracy")
    direction: Direction = "maximize" if maximize else "minimize"
    shown = storage.clip(storage.masked(url))
    try:
        # a concurrent creator of the same new SQLite file waits here until the tables, the
        # study and its identity are all in place, then loads them
        with storage.locked(storage.folder_of(url)):
            study = _create(url, name, direction, pruner)
            stored = study.user_attrs.get("parascale")
            if stored is None:
                study.set_user_attr("parascale", identity)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        raise UsageError(f"cannot open the search's storage {shown!r}: "
                         f"{storage.clip(_first_line(exc, url), 200)}") from None
    except RuntimeError as exc:  # Optuna's schema check: written by another version
        if not storage.version_problem(exc):
            raise
        raise UsageError(f"the study database {shown} was written by another Optuna version: "
                         f"{storage.clip(_first_line(exc, url), 300)}") from None
    if stored is not None and _comparable(stored) != _comparable(identity):
        differ = "; ".join(_differences(_comparable(stored), _comparable(identity)))
        raise UsageError(f"study {name!r} in {shown} is a different search ({differ}): give "
                         f"the same options as before, or {elsewhere} for a new search")
    # Seeded by --seed and the trials so far: a resumed or extended search draws new points
    # instead of its first command's again. constant_liar: a running trial counts as a poor
    # result, so trials started together do not draw the same point (Optuna's advice for
    # parallel TPE).
    study.sampler = optuna.samplers.TPESampler(seed=seed * 1_000_003 + len(study.trials),
                                               constant_liar=True)
    return study


def _create(url: str, name: str, direction: Direction, pruner: str):
    """Optuna's create-or-load; a database server's concurrent creator that won the race for
    the study's row is found on the next attempt."""
    import optuna

    return storage.retried(lambda: optuna.create_study(
        storage=storage.open_storage(url), study_name=name, direction=direction,
        pruner=make_pruner(pruner), load_if_exists=True))


def _first_line(exc: BaseException, url: str) -> str:
    text = storage.scrub(str(exc).strip(), url)
    return text.splitlines()[0] if text else type(exc).__name__


PATHS = ("out", "data_dir")  # fixed options that are paths: compared as the folder they name


def _comparable(ident: dict[str, Any]) -> dict[str, Any]:
    """``ident`` with its paths absolute: hpo/a/, ./hpo/a and /abs/hpo/a are one --out (an
    identity stored by an older parascale holds the path as typed)."""
    fixed = dict(ident.get("fixed") or {})
    fixed.pop("tensorboard", None)  # where the series go is no part of what is searched
    for key in PATHS:
        if isinstance(fixed.get(key), str):
            fixed[key] = os.path.realpath(fixed[key])
    return {**ident, "fixed": fixed}


def _differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each setting that differs, as "--NAME was X, now Y"."""
    said = []
    for key in ("objective", "target"):
        if before.get(key) != now.get(key):
            said.append(f"--{key} was {_value(before.get(key))}, now {_value(now.get(key))}")
    old, new = before.get("fixed") or {}, now.get("fixed") or {}
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            said.append(f"--{key.replace('_', '-')} was {_value(old.get(key))}, "
                        f"now {_value(new.get(key))}")
    if before.get("space") != now.get("space"):
        old_space = {p.get("name"): p for p in before.get("space") or []}
        new_space = {p["name"]: p for p in now.get("space") or []}
        names = sorted(n for n in set(old_space) | set(new_space)
                       if old_space.get(n) != new_space.get(n))
        said.append(f"the searched options differ: {', '.join(map(str, names))}" if names
                    else "the searched options are in another order")
    return said or ["its settings differ"]


def _value(value: Any) -> str:
    return "not given" if value is None else storage.clip(json.dumps(value), 120)


def identity(objective: str, target: float | None, space: list, fixed: dict,
             maximize: bool | None = None) -> dict[str, Any]:
    """What makes two commands the same search (JSON-comparable); ``maximize`` is said for
    a metric's objective (accuracy's and tta's direction is in their name)."""
    said = {} if objective in ("accuracy", "tta") else {"maximize": maximize}
    return json.loads(json.dumps({"objective": objective, "target": target,
                                  "space": [p.to_json() for p in space], "fixed": fixed,
                                  **said}))


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


def recover(study, url: str | None = None, draw=None) -> list[int]:
    """Trials left running by a search process of this machine that is gone: interrupted and
    queued again. Their numbers.

    A search killed while it started a trial left it with only some of its parameters drawn:
    ``draw(trial)`` draws the rest first, so that the retry runs exactly the parameters the
    interrupted trial holds. In a SQLite file (``url``) a trial without an owner is also one a
    search left: every search asks for a trial and names its owner under the file's lock
    (:func:`start`), held here too; a database server's may be another machine's, starting."""
    import optuna
    from optuna.trial import TrialState

    folder = storage.folder_of(url) if url else None
    found = []
    with storage.locked(folder):
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            who = frozen.user_attrs.get(OWNER)
            left = not _alive(who) if who else folder is not None
            if not left:
                continue
            if draw is not None:
                draw(optuna.trial.Trial(study, frozen._trial_id))
                frozen = study._storage.get_trial(frozen._trial_id)
            pid = f"pid {who['pid']}" if who else "which had not named itself"
            interrupt(study, frozen, f"its search ({pid}) ended at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')} or before")
            found.append(frozen.number)
    return found


def start(study, url: str):
    """A new trial of this search, its owner named: together under a SQLite file's lock, so
    that :func:`recover` never finds a live search's trial without an owner."""
    with storage.locked(storage.folder_of(url)):
        trial = study.ask()
        trial.set_user_attr(OWNER, owner())
    return trial


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


CLAIM = "hpo-study.json"  # in --out: the one study whose trials, table and plots it holds


def check_claim(out: Path, url: str, name: str) -> bool:
    """Refuse when ``out`` holds another study's results (trial numbers restart per study, so
    a second study would overwrite the first's trials, table, plots and best model). True when
    ``out`` is not claimed yet."""
    try:
        held = json.loads((out / CLAIM).read_text())
    except FileNotFoundError:
        return True
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {out / CLAIM}, which names the study --out holds "
                         f"({exc}); give another --out") from None
    mine = _claim(url, name)
    if held != mine:
        raise UsageError(f"--out {out} holds study {held.get('study_name')!r} in "
                         f"{held.get('storage')}, and one --out holds one study (another's "
                         f"trials would overwrite its own): give another --out for study "
                         f"{name!r}")
    return False


def claim(out: Path, url: str, name: str, study) -> None:
    """Record that ``out`` holds this study. Trials here, from a parascale that recorded no
    claim, belong to another study when this one has none."""
    trials = out / "trials"
    if not study.trials and trials.is_dir() and any(trials.iterdir()):
        raise UsageError(f"--out {out} holds the trials of another search (study {name!r} "
                         "has none): give another --out")
    atomic_write_text(out / CLAIM, safejson.dumps(_claim(url, name), indent=1))


def _claim(url: str, name: str) -> dict[str, str]:
    return {"storage": storage.masked(url), "study_name": name}
