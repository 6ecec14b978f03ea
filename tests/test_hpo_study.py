"""The study in a real SQLite file: one search per study, trials a dead search left running,
what counts as finished, and the table and figures read back from the storage."""
from __future__ import annotations

import math
import socket

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from parascale.errors import UsageError
from parascale.hpo import plots, results, space, study
from parascale.hpo.search import Search, objective_value

PARAMS = [space.parse_param("lr=0.01:0.5:log"), space.parse_param("batch_size=16,32,64")]
DISTRIBUTIONS = {"lr": FloatDistribution(0.01, 0.5, log=True),
                 "batch_size": CategoricalDistribution((16, 32, 64))}


def _open(tmp_path, objective="accuracy", params=PARAMS, fixed=None):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    ident = study.identity(objective, None if objective == "accuracy" else 0.9, params,
                           fixed or {"epochs": 3})
    return study.open_study(url, "s", ident, 0, "median"), url


def _finished(the_study, number_of, value, batch, state=TrialState.COMPLETE, **attrs):
    the_study.add_trial(create_trial(
        state=state, value=value if state == TrialState.COMPLETE else None,
        params={"lr": 0.1, "batch_size": batch}, distributions=DISTRIBUTIONS,
        intermediate_values={1: 0.5, 2: value or 0.6},
        user_attrs={"val_accuracy": value, "epochs": 2, "training_s": 1.5 + batch / 100,
                    "global_batch": batch, **attrs}))


def test_one_study_is_one_search(tmp_path):
    first, url = _open(tmp_path)
    assert first.direction == optuna.study.StudyDirection.MAXIMIZE
    again, _ = _open(tmp_path)  # the same command: loaded
    assert again._study_id == first._study_id
    with pytest.raises(UsageError, match="different search .*space"):
        _open(tmp_path, params=PARAMS[:1])
    with pytest.raises(UsageError, match="different search .*objective"):
        _open(tmp_path, objective="tta")
    with pytest.raises(UsageError, match="different search .*fixed"):
        _open(tmp_path, fixed={"epochs": 4})
    with pytest.raises(UsageError, match="cannot open the search's storage 'nosuch://x'"):
        study.open_study("nosuch://x", "s", {"objective": "accuracy"}, 0, "none")


def test_trials_a_dead_search_left_running_are_queued_again(tmp_path):
    the_study, _ = _open(tmp_path)
    _finished(the_study, 0, 0.9, 16)
    gone = {"host": socket.gethostname(), "pid": 2**22 + 7, "started": 0.0}  # no such process
    elsewhere = {**gone, "host": "another-machine"}
    owners = [gone, study.owner(), elsewhere]
    for who in owners:
        trial = the_study.ask(DISTRIBUTIONS)
        trial.set_user_attr(study.OWNER, who)
    assert study.counts(the_study) == (1, 3)
    assert study.recover(the_study) == [1]
    trials = the_study.get_trials()
    assert trials[1].state == TrialState.FAIL and study.INTERRUPTED in trials[1].user_attrs
    assert [t.state for t in trials[2:4]] == [TrialState.RUNNING, TrialState.RUNNING]
    queued = trials[4]
    assert queued.state == TrialState.WAITING and queued.user_attrs["retry_of"] == 1
    assert study.counts(the_study) == (1, 2)  # the interrupted trial is not a finished one
    again = the_study.ask(DISTRIBUTIONS)  # the queued parameters come first
    assert again.number == 4 and again.params == trials[1].params
    assert study.recover(the_study) == []  # nothing twice


def test_failed_and_pruned_trials_count_as_finished(tmp_path):
    the_study, _ = _open(tmp_path)
    _finished(the_study, 0, 0.9, 16)
    _finished(the_study, 1, None, 32, state=TrialState.PRUNED)
    _finished(the_study, 2, None, 64, state=TrialState.FAIL, reason="rank 0 failed: nan")
    assert study.counts(the_study) == (3, 0)


def _search(tmp_path, the_study, objective="accuracy"):
    return Search(the_study, "sqlite://", "s", PARAMS, {}, objective, None, "median", tmp_path, 5)


def test_the_table_marks_the_best_and_says_why_trials_ended(tmp_path):
    the_study, _ = _open(tmp_path)
    _finished(the_study, 0, 0.91, 16)
    _finished(the_study, 1, 0.95, 64)
    _finished(the_study, 2, None, 32, state=TrialState.PRUNED)
    _finished(the_study, 3, None, 32, state=TrialState.FAIL, reason="rank 0 failed: nan")
    found = _search(tmp_path, the_study)
    table = results.rows(found)
    assert [r["best"] for r in table] == [False, True, False, False]
    text = results.format_table(table, found)
    assert "1*" in text and "95.00%" in text and "after epoch 2" in text and "nan" in text
    best = results.test_best(found)  # the best trial's model is not here
    assert best["trial"] == 1 and best["test_accuracy"] is None
    assert "not evaluated" in "\n".join(results.best_lines(best, found))
    results.write_csv(table, tmp_path / "trials.csv")
    assert (tmp_path / "trials.csv").read_text().splitlines()[0].startswith("trial,best,state")
    made = {p.name for p in plots.make(table, "accuracy")}
    assert made == {"hpo-objective", "hpo-batch"}


def test_the_objective_of_a_record():
    record = {"epochs": [{"val_accuracy": 0.8}, {"val_accuracy": 0.92}, {"val_accuracy": 0.9}],
              "derived": {"global_batch": 32, "per_device_batch": 32, "effective_lr": 0.1},
              "summary": {"total_time_s": 3.0}, "config": {"out": "x"},
              "time_to_accuracy": {"reached": True, "elapsed_s": 2.5}}
    assert objective_value(record, "accuracy") == 0.92  # the best epoch, not the last
    assert objective_value(record, "tta") == 2.5
    record["time_to_accuracy"] = {"reached": False, "elapsed_s": None}
    assert math.isinf(objective_value(record, "tta"))
