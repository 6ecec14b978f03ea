"""A run's result set on a disk that fills up: a real, small file system (a tmpfs) made full.

A run that cannot write its results is no result: the previous set in --out stays as it was,
and the command says "no space left on device" in one line."""
from __future__ import annotations

import pytest

from conftest import fill_disk, one_line_error, run_training
from parascale.cli.main import main
from parascale.errors import NoSpace
from parascale.runtime.staging import produce

RUN = ["--workers", "1", "--model", "smallcnn", "--dataset", "digits", "--steps", "2",
       "--timeout", "60"]


@pytest.mark.slow
def test_a_rerun_that_cannot_write_its_model_keeps_the_previous_results(small_disk, capsys):
    out = small_disk / "run"
    run_training(out, workers=1, steps=2)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"record.json", "model.pt", "log.txt"} <= before.keys()
    # room for a record (7 KB) but not for the model (600 KB): the model's write fails
    fill_disk(small_disk, leave=64 << 10)
    capsys.readouterr()

    code = main(["train", *RUN, "--out", str(out)])
    line = one_line_error(capsys)
    assert code == 2 and "no space left on device" in line.lower(), line
    assert str(small_disk) in line  # names where
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "run"]  # no staging left


def test_a_record_that_does_not_fit_leaves_the_previous_set_in_place(small_disk):
    out = small_disk / "run"
    out.mkdir()
    (out / "record.json").write_text('{"status": "ok"}')
    (out / "model.pt").write_bytes(b"the old model")

    def run(folder):
        (folder / "model.pt").write_bytes(b"the new model")
        fill_disk(small_disk)  # nothing left for the record
        return {"status": "failed"}

    with pytest.raises(NoSpace) as refused:
        produce(str(out), "x-", run, "record.json", lambda r: "x" * 100_000, ("model.pt",))
    assert "no space left on device" in str(refused.value)
    assert f"{out} is left as it was" in str(refused.value)
    assert (out / "record.json").read_text() == '{"status": "ok"}'
    assert (out / "model.pt").read_bytes() == b"the old model"
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "run"]
