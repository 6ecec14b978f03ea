"""Text from records (model, data set, study, reasons) holding tabs, newlines, '|' and quotes
stays one cell in summary.csv, one row in summary.md and one line in the terminal, written as
escapes; and drawing it in the plots raises no warning (a tab has no glyph in any font)."""
from __future__ import annotations

import csv
import io
import re
import warnings

import pytest

from conftest import record, write_study
from helpers import record_at
from parascale.cli.main import main
from parascale.report import (format_terminal, load_records, load_studies, summary_rows,
                              terminal_summary, write_report)
from parascale.report.tables import CSV_COLUMNS, format_markdown

NAME = 'net\twith "tabs"\nand | lines\''
SHOWN = 'net\\twith "tabs"\\nand | lines\''  # escaped, as the README promises


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("escapes")
    runs = [record(n, 100.0 * n * 0.9, model=NAME) for n in (1, 2, 4)]
    runs.append(record(2, model=NAME, status="failed", reason="died\tat\nstep 3", repeat=1))
    study = write_study(folder / "study", runs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = write_report([study]).parent
    return study, out, caught


def test_csv_keeps_each_value_in_one_cell(report):
    _, out, _ = report
    text = (out / "summary.csv").read_text()
    assert "\t" not in text and text.count("\n") == 1 + 3 + 1  # header, 3 rows, the failed run
    rows = list(csv.DictReader(io.StringIO(text)))
    assert all(len(r) == len(CSV_COLUMNS) for r in rows)
    assert {r["model"] for r in rows} == {SHOWN}
    assert rows[-1]["reason"] == "died\\tat\\nstep 3"


def test_markdown_keeps_each_row_on_one_line(report):
    _, out, _ = report
    text = (out / "summary.md").read_text()
    assert "\t" not in text
    assert f"## {SHOWN.replace('|', chr(92) + '|')} on digits" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 3 and all(line.count(" | ") == table[0].count(" | ") for line in table)
    assert "died\\tat\\nstep 3" in text


def test_the_terminal_says_the_name_on_one_line(report):
    study, _, _ = report
    text = terminal_summary(load_studies([study]))
    assert "\t" not in text
    assert f"{SHOWN} on digits" in text


def test_plotting_such_names_warns_of_nothing(report):
    _, out, caught = report
    assert (out / "throughput.png").is_file()
    assert [str(w.message) for w in caught] == []


def test_csv_text_cells_that_start_a_formula_are_neutralised_numbers_are_not(tmp_path, capsys):
    evil = '=HYPERLINK("http://evil.example","click")'
    sync, base = record_at("n2", 2, 190.0, model=evil), record_at("n2b", 2, 200.0, model=evil, baseline=True)
    base["summary"]["steady_throughput"] = 180.0  # slower than with sync: a negative sync cost
    study = write_study(tmp_path / "s", [
        record_at("n1", 1, 100.0, model=evil), sync, base,
        record_at("n4", 4, model="@SUM(A1)", status="failed", reason="-2+3 crashed"),
        record_at("n8", 8, model="+cmd", dataset="\tdigits", status="oom", reason="\r=1+1")])
    assert main(["report", str(study)]) == 0
    capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO((study / "report" / "summary.csv").read_text())))
    cells = [value for row in rows for value in row.values() if value]
    for start in ("=", "+", "-", "@", "\t", "\r"):
        text = [c for c in cells if c.startswith(start)]
        assert all(re.fullmatch(r"-\d.*", c) for c in text), text  # only negative numbers
    two = next(r for r in rows if r["status"] == "ok" and r["workers"] == "2")
    assert two["model"] == "'" + evil
    assert float(two["sync_cost"]) < 0  # still a number a spreadsheet can compute with
    reasons = {r["status"]: r["reason"] for r in rows}
    assert reasons["failed"] == "'-2+3 crashed" and reasons["oom"] == "'\\r=1+1"


def test_control_characters_from_records_do_not_reach_the_terminal(tmp_path):
    loaded = load_records([write_study(tmp_path / "s", [
        record_at("a", 1, 100.0, model="evil\x1b[2J\x1b]0;owned\x07"), record_at("b", 2, 190.0, model="ok"),
        record_at("c", 4, status="failed", reason="boom\x1b[31m\u202eesrever")])])
    rows = summary_rows(loaded.records)
    for text in (format_terminal(rows, loaded.unfinished, loaded.problems),
                 format_markdown(rows, loaded.unfinished, loaded.problems)):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "evil\\x1b" in text and "\\u202e" in text
