"""What the report reads: hostile run records listed as unreadable, and paths that are neither a
folder nor a file."""

import os
from pathlib import Path

from conftest import one_line_error, record, write_study
from helpers import NESTED, record_at
from parascale.cli.main import main


def hostile_study(tmp_path: Path) -> Path:
    study = write_study(tmp_path / "study", [record(1, 100.0), record(2, 190.0)])
    long = record_at("long", 1, 100.0, model="m" * 200_000)
    wrong = record_at("wrong", 2, 150.0)
    wrong["study"]["scaling"] = ["weak"]  # a list where text belongs
    write_study(study, [long, wrong])
    (study / "runs" / "nested").mkdir()
    (study / "runs" / "nested" / "record.json").write_text(NESTED)
    return study


def test_report_lists_hostile_records_as_unreadable(tmp_path, capsys):
    study = hostile_study(tmp_path)
    assert main(["report", str(study)]) == 0
    out = capsys.readouterr().out
    assert "nested/record.json: unreadable: nested more than 64 levels deep (the limit)" in out
    assert ("long/record.json: unreadable: a string of 200,000 characters at config.model "
            "(the limit is 10,000)") in out
    assert "wrong/record.json: study.scaling is list, expected a string" in out
    assert "95.0%" in out  # the good records still make their table


def test_report_of_something_neither_folder_nor_file_is_one_line(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        assert main(["report", str(path)]) == 2
        assert "is neither a folder nor a file" in one_line_error(capsys)
