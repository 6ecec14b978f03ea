"""Real searches on digits: two trials at once on two cores, a search killed and resumed from
its SQLite file, and a trial pruned by its rank 0 asking the study."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import optuna
import psutil
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from parascale.cli.main import main
from parascale.hpo import study as studies
from parascale.studydb import open_storage
from conftest import wait_until

from parascale.training.loop.pruning import ENV as PRUNER_ENV

pytestmark = pytest.mark.slow

SEARCH = ["hpo", "--model", "smallcnn", "--dataset", "digits", "--param", "lr=0.01:0.1:log",
          "--param", "batch_size=32,64", "--study-name", "t"]
# where what a trial learns is not looked at (a search killed or stopped), an MLP: its epoch
# takes a fraction of the CNN's, and the trials' lifecycle in the study is the same
QUICK = [a if a != "smallcnn" else "mlp" for a in SEARCH]


def _load(out):
    """The study as a reader opens it: the way every opener does (a plain Optuna open while a
    search created the file once failed on its Alembic stamp)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="t", storage=open_storage(f"sqlite:///{out / 'hpo.db'}"))


def _record(out, number):
    return json.loads((out / "trials" / f"{number:04d}" / "record.json").read_text())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_trials_at_once_on_their_own_cores(tmp_path, capfd):
    out = tmp_path / "search"
    code = main([*SEARCH, "--trials", "4", "--epochs", "3", "--objective", "tta",
                 "--target", "0.8", "--pruner", "none", "--out", str(out)])
    text = capfd.readouterr().out
    assert code == 0
    trials = _load(out).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    # trials ran at the same time, each pinned to a core of its own
    overlapping = [(a, b) for a in trials for b in trials if a.number < b.number
                   and a.datetime_start < b.datetime_complete
                   and b.datetime_start < a.datetime_complete]
    assert overlapping
    for a, b in overlapping:
        cores = [_record(out, t.number)["environment"]["cpu_affinity_per_rank"] for t in (a, b)]
        assert len(cores[0]) == len(cores[1]) == 1 and len(cores[0][0]) == 1
        assert not set(cores[0][0]) & set(cores[1][0])
    for t in trials:  # trials look at the validation split only, and stop at the target
        record = _record(out, t.number)
        assert record["config"]["evaluate_test"] is False and record["config"]["val_fraction"] == 0.2
        assert all(e["test_accuracy"] is None for e in record["epochs"])
        assert record["time_to_accuracy"]["split"] == "validation"
        assert t.value == record["time_to_accuracy"]["elapsed_s"]
    best = json.loads((out / "best.json").read_text())
    assert best["trial"] == min(trials, key=lambda t: t.value).number
    assert 0.5 < best["test_accuracy"] <= 1 and best["evaluated_now"]
    assert "evaluated once, now, for this trial only" in text
    models = sorted(p.parent.name for p in out.glob("trials/*/model.pt"))
    assert models == [f"{best['trial']:04d}"]  # only the best trial's model is kept
    assert len((out / "trials.csv").read_text().splitlines()) == 5
    assert (out / "plots" / "hpo-objective.png").exists()
    # run again: nothing more to do, and the test set is not evaluated a second time
    assert main([*SEARCH, "--trials", "4", "--epochs", "3", "--objective", "tta",
                 "--target", "0.8", "--pruner", "none", "--out", str(out)]) == 0
    assert len(_load(out).trials) == 4
    assert "evaluated once, when it became the best" in capfd.readouterr().out


def test_a_killed_search_resumes_without_losing_or_repeating_a_trial(tmp_path, capfd):
    out = tmp_path / "search"
    args = [*QUICK, "--trials", "3", "--epochs", "3", "--pruner", "none", "--out", str(out)]
    said = tmp_path / "search.log"  # what the search printed, shown if it never got there
    with said.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "parascale", *args], stdout=log,
                                stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        def one_done_and_one_running():
            # the search prints this line once its study is in place: opening the database
            # before it would race the search creating it
            if "parascale hpo: study" not in said.read_text():
                return False
            states = [t.state for t in _load(out).trials]
            return TrialState.COMPLETE in states and TrialState.RUNNING in states
        assert wait_until(one_done_and_one_running, 120), said.read_text()[-3000:]
        family = psutil.Process(proc.pid).children(recursive=True)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # the trials and their workers die with the search
    assert wait_until(lambda: not [p for p in family if p.is_running()
                                   and p.status() != psutil.STATUS_ZOMBIE], 30)
    before = {t.number: t for t in _load(out).trials}
    finished_before = {n for n, t in before.items() if t.state == TrialState.COMPLETE}
    left_running = {n for n, t in before.items() if t.state == TrialState.RUNNING}
    assert finished_before and left_running
    # the trials' owner is gone as the next search will judge it (not a fixed pause). The kill
    # may land while the search starts a trial: after it asked for it, before it named its
    # owner or drew each parameter; the next search finishes the draw before queuing it again
    owners = [before[n].user_attrs.get(studies.OWNER) for n in left_running]
    assert wait_until(lambda: not any(studies._alive(who) for who in owners if who), 30)
    assert main(args) == 0
    assert "were left running by a search that ended: queued again" in capfd.readouterr().out
    after = _load(out).trials
    done = [t for t in after if t.state == TrialState.COMPLETE]
    assert len(done) == 3
    for number in finished_before:  # finished trials are kept as they were, never re-run
        assert after[number].state == TrialState.COMPLETE
        assert after[number].value == before[number].value
    interrupted = [t for t in after if studies.INTERRUPTED in t.user_attrs]
    assert {t.number for t in interrupted} == left_running
    retries = [t for t in after if "retry_of" in t.user_attrs]
    assert sorted(t.user_attrs["retry_of"] for t in retries) == sorted(left_running)
    for retry in retries:  # each lost trial ran again, with its parameters, exactly once
        assert retry.state == TrialState.COMPLETE
        assert retry.params == after[retry.user_attrs["retry_of"]].params
    assert not [t for t in after if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def _judged_trial(tmp_path, monkeypatch):
    """A study with two earlier trials far better at every epoch, and the trial the next run
    is (the median rule prunes it at its first judged epoch, 2)."""
    storage = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    the_study = optuna.create_study(storage=storage, study_name="t", direction="maximize")
    lr = {"lr": FloatDistribution(0.001, 0.1)}
    for _ in range(2):
        the_study.add_trial(create_trial(value=0.999, params={"lr": 0.05}, distributions=lr,
                                         intermediate_values={1: 0.999, 2: 0.999, 3: 0.999}))
    trial = the_study.ask(lr)
    monkeypatch.setenv(PRUNER_ENV, json.dumps({
        "storage": storage, "study": "t", "trial_id": trial._trial_id, "number": trial.number,
        "pruner": "median", "objective": "accuracy"}))
    return the_study, trial


def test_rank_0_asks_the_study_and_every_rank_stops_when_pruned(tmp_path, capfd, monkeypatch):
    the_study, trial = _judged_trial(tmp_path, monkeypatch)
    out = tmp_path / "run"
    code = main(["train", "--workers", "2", "--model", "smallcnn", "--epochs", "4", "--lr",
                 "0.001", "--val-fraction", "0.2", "--no-evaluate-test", "--out", str(out)])
    text = capfd.readouterr().out
    assert code == 0
    record = json.loads((out / "record.json").read_text())
    # epoch 1 is the warm-up, never judged; epoch 2 falls below the median
    assert record["search"] == {"trial": trial.number, "pruned_at_epoch": 2}
    assert len(record["epochs"]) == 2
    assert "the search pruned this trial after epoch 2" in text
    reported = the_study.trials[trial.number].intermediate_values
    assert list(reported) == [1, 2]
    assert reported[2] == record["epochs"][1]["val_accuracy"]


def test_a_trial_that_finished_its_epochs_is_never_pruned(tmp_path, capfd, monkeypatch):
    """The pruner is not asked after the last epoch: a trial that trained every epoch ends
    complete, with its objective, even when it is below the median there (its value is still
    reported, for trials that run longer)."""
    the_study, trial = _judged_trial(tmp_path, monkeypatch)
    out = tmp_path / "run"
    # epoch 1 is the median rule's warm-up; epoch 2, the first it judges, is the last
    code = main(["train", "--workers", "2", "--model", "mlp", "--epochs", "2", "--lr", "0.001",
                 "--val-fraction", "0.2", "--no-evaluate-test", "--out", str(out)])
    text = capfd.readouterr().out
    assert code == 0
    record = json.loads((out / "record.json").read_text())
    assert record["search"] == {"trial": trial.number, "pruned_at_epoch": None}
    assert len(record["epochs"]) == 2 and "pruned" not in text
    reported = the_study.trials[trial.number].intermediate_values
    assert list(reported) == [1, 2]


def test_sigterm_stops_the_trials_and_queues_them_again(tmp_path):
    out = tmp_path / "search"
    args = [*QUICK, "--trials", "4", "--epochs", "30", "--pruner", "none", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "parascale", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        def running():
            if not (out / "hpo.db").exists():
                return False
            try:  # a trial is training once its first epoch is in its log
                return any("epoch 1/30" in p.read_text() for p in out.glob("trials/*/log.txt"))
            except OSError:
                return False
        assert wait_until(running, 120)
        family = psutil.Process(proc.pid).children(recursive=True)
        names = [(p.pid, p.name(), p.ppid()) for p in family]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "parascale: terminated (SIGTERM)" in err
    left = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, (names, left)
    trials = _load(out).trials
    stopped = [t for t in trials if studies.INTERRUPTED in t.user_attrs]
    assert stopped and all(t.state == TrialState.FAIL for t in stopped)
    assert "the search was stopped while it ran" in stopped[0].user_attrs[studies.INTERRUPTED]
    queued = [t for t in trials if t.state == TrialState.WAITING]
    assert sorted(t.user_attrs["retry_of"] for t in queued) == sorted(t.number for t in stopped)
    assert not [t for t in trials if t.state == TrialState.RUNNING]


def test_when_every_trial_fails_the_last_line_names_only_what_was_written(tmp_path, capfd):
    out = tmp_path / "search"
    code = main(["hpo", "--model", "smallcnn", "--dataset", "digits", "--param",
                 "lr=1000:10000:log", "--trials", "1", "--epochs", "2", "--pruner", "none",
                 "--out", str(out)])  # such rates make the loss infinite in the first epoch
    text = capfd.readouterr().out
    assert code == 0
    assert "trial 0 (lr=" in text and ": failed: " in text and "no trial completed" in text
    assert text.strip().splitlines()[-1] == f"table: {out / 'trials.csv'}"
    assert not (out / "best.json").exists() and not (out / "plots").exists()


BROKEN_TEST_SET = """
import torch
from torch import nn
from parascale.tasks import Task

class Points(torch.utils.data.Dataset):
    def __init__(self, n, readable):
        g = torch.Generator().manual_seed(n)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)
        self.readable = readable
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        if i >= self.readable:
            raise OSError(f"sample {i} is on a disk that went away")
        return self.x[i], self.y[i]

def mse(net, batch):
    return nn.functional.mse_loss(net(batch[0]), batch[1])

def task():
    # the check before the search reads the first three test samples, the trials none (they
    # look at the validation split alone): only the best trial's test evaluation reaches more
    return Task(train_data=Points(64, 64), eval_data=Points(16, 3),
                model=lambda: nn.Linear(4, 1), loss=mse)
"""


def test_a_failed_test_evaluation_keeps_the_searchs_results(tmp_path, capfd, monkeypatch):
    (tmp_path / "brokentest.py").write_text(BROKEN_TEST_SET)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "search"
    code = main(["hpo", "--task", "brokentest:task", "--objective", "loss", "--trials", "2",
                 "--epochs", "1", "--batch-size", "16", "--param", "lr=0.01:0.1",
                 "--pruner", "none", "--study-name", "t", "--out", str(out)])
    captured = capfd.readouterr()
    assert code == 1, captured.err
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, captured.err
    assert "test evaluation" in err[0] and "OSError: sample 3" in err[0]
    assert "results are kept" in err[0] and str(out / "trials.csv") in err[0]
    assert len((out / "trials.csv").read_text().splitlines()) == 3
    best = json.loads((out / "best.json").read_text())
    assert best["trial"] in (0, 1) and best["test_loss"] is None
    assert "OSError" in best["why"]
    # nothing stored as tested: the next command evaluates again
    assert not [k for k in _load(out).user_attrs if k.startswith("test_of_trial_")]
