"""``parascale hpo`` refuses bad input in one line, with exit code 2, and writes nothing."""
from __future__ import annotations

import sqlite3

import optuna
import pytest
import torch

from parascale.cli.main import main
from parascale import studydb as storage
from parascale.hpo import study

BASE = ["hpo", "--model", "smallcnn", "--dataset", "digits", "--epochs", "1", "--trials", "2"]


@pytest.mark.parametrize("args, words", [
    (["--param", "lr=0.5"], "lr has one value"),
    ([], "nothing to search"),
    (["--param", "lr=0.01:0.1", "--objective", "tta"], "--objective tta needs --target"),
    (["--param", "lr=0.01:0.1", "--target", "0.9"], "--target belongs to --objective tta"),
    (["--param", "lr=0.01:0.1", "--objective", "tta", "--target", "1.5"], "fraction"),
    (["--param", "lr=0.01:0.1", "--devices-per-trial", "64"], "more than the"),
    (["--param", "period=2:8"], "which no trial would use"),
    (["--param", "lr=0.01:0.1", "--trials", "0"], "--trials must be a positive"),
    (["--param", "batch_size=16,4096"], "batch_size=4096"),
    (["--param", "lr=0.01:0.1", "--storage", "nosuch://db"], "cannot open the search's storage"),
    (["--param", "lr=0.01:0.1", "--val-fraction", "1.5"], "--val-fraction"),
    (["--param", "lr=0.01:0.1", "--space", "nope.yaml"], "does not exist"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capfd, args, words):
    out = tmp_path / "search"
    code = main([*BASE, *args, "--out", str(out)])
    err = capfd.readouterr().err
    assert code == 2, err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpus_without_cuda_says_what_hpo_can_do_instead(tmp_path, capfd):
    out = tmp_path / "search"
    assert main([*BASE, "--param", "lr=0.01:0.1", "--gpus", "0", "--out", str(out)]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gpus 0 needs CUDA" in err
    assert "leave out --gpus" in err and "--workers" not in err  # hpo has no --workers
    assert not out.exists()


def _refused(capfd, *args) -> str:
    assert main([*BASE, *args]) == 2
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://",
                                 "sqlite:///file:x?mode=memory&uri=true"])
def test_a_database_in_memory_is_refused(tmp_path, capfd, url):
    out = tmp_path / "search"
    err = _refused(capfd, "--param", "lr=0.01:0.1", "--storage", url, "--out", str(out))
    assert "in one process's memory" in err and "sqlite:///hpo.db" in err
    assert not out.exists()


def test_a_password_in_the_storage_url_is_never_shown(tmp_path, capfd):
    out = tmp_path / "search"
    url = "postgresql://ann:s3cr%40t@127.0.0.1:1/db"
    err = _refused(capfd, "--param", "lr=0.01:0.1", "--storage", url, "--out", str(out))
    assert "'postgresql://ann:***@127.0.0.1:1/db'" in err
    assert "s3cr" not in err and "t@127" not in err
    assert not out.exists()
    assert storage.masked("mysql+pymysql://u:p/w@d@h/x?y=1") == "mysql+pymysql://u:***@h/x?y=1"
    assert storage.scrub("login as u with s3cr@t failed", url) == "login as u with *** failed"


def test_a_study_of_another_optuna_version_is_one_line(tmp_path, capfd):
    db = tmp_path / "old.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(storage=f"sqlite:///{db}", study_name="parascale")
    with sqlite3.connect(db) as connection:  # as a newer Optuna would have left it
        connection.execute("UPDATE alembic_version SET version_num = 'v9.0.0.a'")
        connection.execute("UPDATE version_info SET library_version = '9.0.0'")
    out = tmp_path / "search"
    err = _refused(capfd, "--param", "lr=0.01:0.1", "--storage", f"sqlite:///{db}",
                   "--out", str(out))
    assert "was written by another Optuna version" in err and "optuna 9.0.0" in err
    assert not out.exists()


def test_learning_rates_beyond_a_sane_bound_are_refused_before_a_trial(tmp_path, capfd):
    out = tmp_path / "search"
    err = _refused(capfd, "--param", "lr=1e-300:1e308:log", "--out", str(out))
    assert "with lr=1e-300" in err and "--lr must be in [1e-10, 10000]" in err
    err = _refused(capfd, "--param", "weight_decay=0:1e308", "--out", str(out))
    assert "--weight-decay must be in [0, 10000], got 1e+308" in err
    assert not out.exists()
    # the same bound for a plain training run
    assert main(["train", "--model", "smallcnn", "--lr", "1e300", "--out", str(out)]) == 2
    assert "--lr must be in [1e-10, 10000], got 1e+300" in capfd.readouterr().err


def test_a_long_refused_param_is_echoed_in_part(tmp_path, capfd):
    values = ",".join(f"v{i}" for i in range(20_000))  # about 130 KB
    for param in (f"lr={values}", f"lr={values},v0", f"nosuch{values}=1,2"):
        err = _refused(capfd, "--param", param, "--out", str(tmp_path / "search"))
        assert len(err) < 600 and "characters)" in err


def test_one_out_holds_one_study(tmp_path, capfd):
    out = tmp_path / "search"
    url = f"sqlite:///{out / 'hpo.db'}"
    out.mkdir()
    first = study.open_study(url, "a", {"objective": "accuracy"}, 0, "none")
    study.claim(out, url, "a", first)
    (out / "trials" / "0000").mkdir(parents=True)
    err = _refused(capfd, "--param", "lr=0.01:0.1", "--study-name", "b", "--out", str(out))
    assert f"--out {out} holds study 'a' in {url}" in err and "give another --out" in err
    assert optuna.study.get_all_study_names(storage=url) == ["a"]
    # a folder from before the claim was recorded, with another search's trials
    (out / study.CLAIM).unlink()
    err = _refused(capfd, "--param", "lr=0.01:0.1", "--study-name", "b", "--out", str(out))
    assert "holds the trials of another search" in err
    assert not (out / study.CLAIM).exists()
