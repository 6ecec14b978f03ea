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
from parascale import studydb as storage
from parascale.hpo import plots, results, search, space, study
from parascale.hpo.search import Search, facts_of, objective_value

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
    with pytest.raises(UsageError, match="different search .*searched options differ: "
                       "batch_size"):
        _open(tmp_path, params=PARAMS[:1])
    with pytest.raises(UsageError, match='different search .*--objective was "accuracy", '
                       'now "tta"'):
        _open(tmp_path, objective="tta")
    # the refusal names each setting that differs, and sends a new search elsewhere (another
    # --study-name in the same --out would overwrite this one's trials)
    with pytest.raises(UsageError) as refused:
        _open(tmp_path, fixed={"epochs": 4, "seed": 1})
    assert "(--epochs was 3, now 4; --seed was not given, now 1)" in str(refused.value)
    assert str(refused.value).endswith("or another --out for a new search")
    assert "--study-name" not in str(refused.value)


def test_out_is_the_same_folder_however_it_is_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, _ = _open(tmp_path, fixed={"epochs": 3, "out": "hpo/kill/"})
    for typed in ("hpo/kill", "./hpo/kill", str(tmp_path / "hpo" / "kill")):
        again, _ = _open(tmp_path, fixed={"epochs": 3, "out": typed})
        assert again._study_id == first._study_id
    with pytest.raises(UsageError) as refused:
        _open(tmp_path, fixed={"epochs": 3, "out": str(tmp_path / "hpo" / "other")})
    assert f'(--out was "{tmp_path}/hpo/kill", now "{tmp_path}/hpo/other")' in str(refused.value)
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


def test_a_trial_its_search_left_half_drawn_runs_again_with_all_its_parameters(tmp_path):
    """SIGKILL lands anywhere in a trial's start: after Optuna's ask but before its owner is
    named, or between one parameter and the next. Both are retried with the exact parameters
    the interrupted trial holds (once a retry's differed: it drew batch_size afresh)."""
    the_study, url = _open(tmp_path)
    gone = {"host": socket.gethostname(), "pid": 2**22 + 7, "started": 0.0}  # no such process
    half = the_study.ask()
    half.set_user_attr(study.OWNER, gone)
    half.suggest_float("lr", 0.01, 0.5, log=True)  # killed before batch_size was drawn
    the_study.ask()  # killed before it named its owner
    fixed = {"epochs": 3}
    assert study.recover(the_study, url, lambda t: search.draw(PARAMS, fixed, t)) == [0, 1]
    trials = the_study.get_trials()
    assert [t.state for t in trials[:2]] == [TrialState.FAIL] * 2
    assert all(set(t.params) == {"lr", "batch_size"} for t in trials[:2])
    assert trials[0].params["lr"] == half.params["lr"]
    for original in trials[:2]:  # each retry, started as a search starts it, runs them as drawn
        retry = study.start(the_study, url)
        assert retry.user_attrs["retry_of"] == original.number
        assert search.draw(PARAMS, fixed, retry) == original.params
    assert study.recover(the_study, url, lambda t: search.draw(PARAMS, fixed, t)) == []


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


def test_a_task_without_accuracy_shows_its_objective_metric_by_name(tmp_path):
    the_study, _ = _open(tmp_path, "mae")
    for number, (mae, batch) in enumerate([(0.31, 16), (0.27, 64)]):
        _finished(the_study, number, mae, batch, val_accuracy=None, val_best=mae)
    _finished(the_study, 2, None, 32, state=TrialState.PRUNED, val_accuracy=None, val_best=0.5)
    found = Search(the_study, "sqlite://", "s", PARAMS, {}, "mae", None, "median", tmp_path, 5,
                   maximize=False)
    table = results.rows(found)
    head, *lines = results.format_table(table, found).splitlines()
    assert "val mae" in head and "val acc" not in head
    assert "0.27" in lines[1].split("64", 1)[1] and "0.5" in lines[2].split("32", 1)[1]
    assert {p.name for p in plots.make(table, "mae", maximize=False)} == {"hpo-objective",
                                                                          "hpo-batch"}
    record = {"epochs": [{"val_mae": 0.4}, {"val_mae": 0.2}, {"val_mae": 0.3}],
              "derived": {"global_batch": 32, "per_device_batch": 32, "effective_lr": 0.1},
              "summary": {"total_time_s": 3.0}, "config": {"out": "x"}}
    assert facts_of(record, "mae", maximize=False)["val_best"] == 0.2  # lowest: lower is better


def test_the_objective_of_a_record():
    record = {"epochs": [{"val_accuracy": 0.8}, {"val_accuracy": 0.92}, {"val_accuracy": 0.9}],
              "derived": {"global_batch": 32, "per_device_batch": 32, "effective_lr": 0.1},
              "summary": {"total_time_s": 3.0}, "config": {"out": "x"},
              "time_to_accuracy": {"reached": True, "elapsed_s": 2.5}}
    assert objective_value(record, "accuracy") == 0.92  # the best epoch, not the last
    assert objective_value(record, "tta") == 2.5
    record["time_to_accuracy"] = {"reached": False, "elapsed_s": None}
    assert math.isinf(objective_value(record, "tta"))


def test_a_sqlite_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.normal("sqlite:///a/hpo.db") == f"sqlite:///{tmp_path}/a/hpo.db"
    assert storage.normal("postgresql://u:p@h/db") == "postgresql://u:p@h/db"
    assert storage.folder_of("sqlite:///a/hpo.db") == tmp_path / "a"
    with pytest.raises(UsageError, match="memory"):
        storage.normal("sqlite:///:memory:")
