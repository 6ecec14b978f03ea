"""``parascale hpo`` refuses bad input in one line, with exit code 2, and writes nothing."""
from __future__ import annotations

import pytest

from parascale.cli.main import main

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
