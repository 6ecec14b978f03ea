"""What a search found: the table of trials, the best one tested once, and the figures.

Everything here is read from the study's storage (each trial's facts are kept there when it
ends), so a search shared by several machines reports the same table on each. The test set is
evaluated once, for the best trial, on the model that trial saved; the result is stored with
the trial, so a later command reports it again without evaluating it again.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from parascale import safejson
from parascale.columns import aligned
from parascale.files import atomic_write_text
from parascale.hpo import objective as objectives
from parascale.hpo.search import MODEL, Search, describe_value, trial_folder
from parascale.hpo.study import INTERRUPTED
from parascale.models.probe import short_cause


def rows(search: Search) -> list[dict[str, Any]]:
    """One row per trial, in trial order."""
    names = [p.name for p in search.space]
    best = _best_number(search.study)
    metric = objectives.metric(search.objective)
    tested = search.study.user_attrs
    table = []
    for frozen in search.study.get_trials(deepcopy=False):
        attrs = frozen.user_attrs
        state = frozen.state.name.lower()
        note = attrs.get("reason") or ""
        if INTERRUPTED in attrs:
            state, note = "interrupted", f"{attrs[INTERRUPTED]}; queued again"
        elif state == "pruned":
            note = f"after epoch {attrs.get('epochs', '?')}"
        elif state == "waiting":
            note = "queued" + (f" (again, for trial {attrs['retry_of']})" if "retry_of" in attrs
                               else "")
        if "retry_of" in attrs and state != "waiting":
            note = (note + "; " if note else "") + f"re-run of trial {attrs['retry_of']}"
        value = frozen.value if frozen.state.name == "COMPLETE" else None
        table.append({"trial": frozen.number, "best": frozen.number == best, "state": state,
                      "value": value, **{n: frozen.params.get(n) for n in names},
                      "val_accuracy": attrs.get("val_accuracy"),
                      # a trial stored before val_best: its accuracy was the objective's metric
                      "val_best": attrs.get("val_best", attrs.get("val_accuracy")
                                            if metric == "accuracy" else None),
                      "epochs": attrs.get("epochs"),
                      "training_s": attrs.get("training_s"),
                      "global_batch": attrs.get("global_batch"),
                      "effective_lr": attrs.get("effective_lr"),
                      "peak_memory_bytes": attrs.get("peak_memory_bytes"),
                      "test_accuracy": (tested.get(f"test_of_trial_{frozen.number}")
                                        or {}).get("test_accuracy"), "note": note})
    return table


def _best_number(study) -> int | None:
    try:
        return study.best_trial.number
    except ValueError:  # no complete trial yet
        return None


def format_table(table: list[dict[str, Any]], search: Search) -> str:
    names = [p.name for p in search.space]
    metric = objectives.metric(search.objective)
    head = ["trial", "state", "objective", *names,
            "val acc" if metric == "accuracy" else f"val {metric}", "epochs", "time s", "note"]
    lines = [head]
    for row in table:
        value = objectives.shown(search.objective, row["value"])
        lines.append([f"{row['trial']}{'*' if row['best'] else ''}", row["state"], value,
                      *[_cell(row[n]) for n in names],
                      objectives.shown(metric, row["val_best"]),
                      _cell(row["epochs"]),
                      "" if row["training_s"] is None else f"{row['training_s']:.1f}",
                      row["note"]])
    return aligned(lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_csv(table: list[dict[str, Any]], path: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(table[0]) if table else ["trial"])
    writer.writeheader()
    writer.writerows(table)
    return atomic_write_text(path, buffer.getvalue())


def best_trial(search: Search) -> dict[str, Any] | None:
    """The best trial, with its test figures when they were evaluated before; None without a
    complete trial."""
    try:
        best = search.study.best_trial
    except ValueError:
        return None
    found = {"trial": best.number, "objective": search.objective, "value": best.value,
             "params": best.params, "record": best.user_attrs.get("record")}
    tested = search.study.user_attrs.get(f"test_of_trial_{best.number}")
    if tested is not None:
        return {**found, **tested, "evaluated_now": False}
    return {**found, "test_accuracy": None, "test_loss": None, "why": "not evaluated yet"}


def test_best(search: Search) -> dict[str, Any] | None:
    """The best trial with its test figures: evaluated now if it never was, once. An
    evaluation that fails is said in ``why`` and ``failed`` and not stored, so the next
    command tries again."""
    found = best_trial(search)
    if found is None or "evaluated_now" in found:  # evaluated by an earlier command
        return found
    found.pop("why")
    folder = trial_folder(search.out, found["trial"])
    if not (folder / MODEL).exists():
        return {**found, "why": f"its model ({folder / MODEL}) is not on this machine"}
    try:
        values = _evaluate(folder)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's data or metric: kept
        why = f"its test evaluation failed: {type(exc).__name__}: {short_cause(exc)}"
        return {**found, "why": why, "failed": True}
    tested = {"test_accuracy": values.get("accuracy"), "test_loss": values["loss"],
              "test_metrics": values}
    # a finished trial's own attributes are read-only: the study keeps it
    search.study.set_user_attr(f"test_of_trial_{found['trial']}", tested)
    return {**found, **tested, "evaluated_now": True}


def _evaluate(folder: Path) -> dict[str, float]:
    """The saved model of a trial on its configuration's test set, in this process."""
    import torch

    from parascale import tasks
    from parascale.training.loop.evaluate import evaluate_alone

    cfg = tasks.config_of_record(json.loads((folder / "record.json").read_text())["config"])
    task, bundle = tasks.prepare(cfg)
    torch.manual_seed(cfg.job.seed)
    model = task.model()
    state = torch.load(folder / MODEL, map_location="cpu", weights_only=True)
    # a compiled model's keys carry torch.compile's wrapper prefix
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in state.items()})
    return evaluate_alone(task, model, bundle.test)


def best_lines(best: dict[str, Any] | None, search: Search) -> list[str]:
    if best is None:
        return ["no trial completed: no best trial yet"]
    params = ", ".join(f"{k}={_cell(v)}" for k, v in best["params"].items())
    lines = [f"best: trial {best['trial']} ({params}): "
             f"{describe_value(search.objective, best['value'])}"]
    name = objectives.metric(search.objective)
    tested = (best.get("test_metrics") or {}).get(name, best.get("test_accuracy")
                                                  if name == "accuracy" else None)
    if "why" in best:
        lines.append(f"  test {name}: not evaluated ({best['why']})")
    elif tested is None:
        lines.append(f"  test {name}: not among the test set's metrics")
    else:
        when = "evaluated once, now, for this trial only" if best["evaluated_now"] else \
            "evaluated once, when it became the best"
        figure = f"{tested:.2%}" if name == "accuracy" else f"{tested:.4g}"
        lines.append(f"  test {name} {figure} ({when}; the search looked only at the "
                     "validation split)")
    return lines


def write_best(best: dict[str, Any], path: Path) -> Path:
    return atomic_write_text(path, safejson.dumps(best, indent=1, default=str))
