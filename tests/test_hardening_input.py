"""Hostile input in studies and records (issue 16): refused with one line, quickly, never a crash.

Every input here comes from a file or a command line someone else may have written: a study file,
an expression in it, a run record copied from elsewhere. No training runs; the command line is
called in-process.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path

import pytest

import parascale.data
import parascale.models
from parascale.bench import expr
from parascale.bench.expr import ExprError, evaluate
from parascale.bench.plan import PlanError, build_plan, load_study_file
from parascale.bench.runner import existing_records, run_study
from parascale.bench.study import combine, make_jobs
from parascale.cli.main import main
from parascale.errors import UsageError
from parascale.report import load_records, summary_rows
from parascale.report.plots import series_labels
from parascale.report.tables import format_markdown, format_terminal
from conftest import one_line_error, record, write_study

TINY = {"model": "mlp", "dataset": "digits", "steps": 2, "timeout": 60.0}
NESTED = "[" * 100_000 + "]" * 100_000  # 200 KB of brackets


def rec(folder: str, *args, **kwargs) -> dict:
    """A record from conftest, filed under runs/``folder`` (not under its model name,
    which may be long or strange)."""
    data = record(*args, **kwargs)
    data["study"]["config_id"] = folder
    return data


# --- item 2: summary.csv must not carry formulas ------------------------------------------------

def test_csv_text_cells_that_start_a_formula_are_neutralised_numbers_are_not(tmp_path, capsys):
    evil = '=HYPERLINK("http://evil.example","click")'
    sync, base = rec("n2", 2, 190.0, model=evil), rec("n2b", 2, 200.0, model=evil, baseline=True)
    base["summary"]["steady_throughput"] = 180.0  # slower than with sync: a negative sync cost
    study = write_study(tmp_path / "s", [
        rec("n1", 1, 100.0, model=evil), sync, base,
        rec("n4", 4, model="@SUM(A1)", status="failed", reason="-2+3 crashed"),
        rec("n8", 8, model="+cmd", dataset="\tdigits", status="oom", reason="\r=1+1")])
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
        rec("a", 1, 100.0, model="evil\x1b[2J\x1b]0;owned\x07"), rec("b", 2, 190.0, model="ok"),
        rec("c", 4, status="failed", reason="boom\x1b[31m\u202eesrever")])])
    rows = summary_rows(loaded.records)
    for text in (format_terminal(rows, loaded.unfinished, loaded.problems),
                 format_markdown(rows, loaded.unfinished, loaded.problems)):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "evil\\x1b" in text and "\\u202e" in text


# --- item 9: duplicate keys in study files -----------------------------------------------------

def test_duplicate_yaml_key_is_refused_naming_the_key_and_both_lines(tmp_path, capsys):
    study = tmp_path / "dup.yaml"
    study.write_text("parameters:\n  model: mlp\n  dataset: digits\n  model: smallcnn\n")
    with pytest.raises(PlanError, match=r"duplicate key 'model' at line 4 \(first at line 2\)"):
        load_study_file(study)
    assert main(["bench", "--config", str(study), "--workers", "1", "--dry-run"]) == 2
    assert "duplicate key 'model'" in one_line_error(capsys)


def test_duplicate_keys_are_compared_as_values_anywhere_in_the_file(tmp_path):
    study = tmp_path / "dup.yaml"
    study.write_text("extensions:\n  - cases:\n      - {lr: 0.1, 0x1: a, 1: b}\n")
    with pytest.raises(PlanError, match="duplicate key 1 at line 3"):
        load_study_file(study)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    study = tmp_path / "merge.yaml"
    study.write_text("variables:\n  lr: &lr [0.1, 0.2]\n  base: [{<<: {a: 1, b: 2}, b: 3}]\n")
    assert load_study_file(study)["variables"]["base"] == [{"a": 1, "b": 3}]


def test_toml_refuses_duplicate_keys_itself(tmp_path):
    study = tmp_path / "dup.toml"
    study.write_text("[parameters]\nmodel = 'mlp'\nmodel = 'smallcnn'\n")
    with pytest.raises(PlanError, match=r"dup\.toml.*line 3"):
        load_study_file(study)


# --- item 10: expressions are bounded in size and time -----------------------------------------

@pytest.mark.parametrize("text", [
    "[[0] * 100] * 101",  # 10,100 numbers in 101 shared rows
    "len([[[0] * 100] * 100] * 100)",  # a million, never built
    "len([[0] * 10000] + [[1] * 10000])",
    "(1, (2,) * 10000)",
    "[10 ** 60 * 10 ** 60 * 10 ** 60 * 10 ** 60] * 1000",  # 241 digits: 13 units each
])
def test_values_are_measured_with_nested_lists_counted_in_full(text):
    with pytest.raises(ExprError, match=r"limit 10,000"):
        evaluate(text, {})


def test_nested_repetition_from_the_issue_is_refused_at_once():
    with pytest.raises(ExprError, match=r"repeating a value of size 10,000 10000 times is too "
                                        r"large \(limit 10,000\)"):
        evaluate("len(str([[[0]*10000]*10000]*10000))", {})


def test_values_read_from_the_study_are_bounded_too():
    with pytest.raises(ExprError, match=r"limit 10,000"):
        evaluate("len(x)", {"x": list(range(20_000))})
    assert evaluate("len(x)", {"x": list(range(10_000))}) == 10_000


def test_text_is_measured_before_it_is_built():
    with pytest.raises(ExprError, match=r"would be 15,012 characters long \(limit 10,000\)"):
        evaluate("'${x}${x}${x}'", {"x": "y" * 5000})
    with pytest.raises(ExprError, match=r"format\(\) would make about 20,000 characters"):
        evaluate("format(t, x)", {"t": "{0}" * 200, "x": "y" * 100})


def test_evaluation_has_a_deadline(monkeypatch):
    monkeypatch.setattr(expr, "MAX_SECONDS", -1.0)  # any evaluation is past it at its first step
    with pytest.raises(ExprError, match=r"took longer than -1 s \(the limit\)"):
        evaluate("1 + 1", {})


def test_values_at_the_limits_still_work():
    assert evaluate("len([[0] * 100] * 100)", {}) == 100
    assert evaluate("len('x' * 10000)", {}) == 10_000
    assert evaluate("len(str(2 ** 64))", {}) == 20


# --- item 11 (and kin): YAML aliases, recursion, nesting, size ---------------------------------

def alias_bomb(path: Path) -> Path:
    lines = ["parameters:", "  model: mlp", "  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    previous = "a"
    for name in "bcdefghi":
        lines.append(f"  {name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
        previous = name
    path.write_text("\n".join(lines) + "\n")
    assert len(path.read_bytes()) < 600
    return path


def test_alias_bomb_is_refused_before_it_is_constructed(tmp_path):
    with pytest.raises(PlanError, match=r"bomb\.yaml.*expands, with its aliases, to more than "
                                        r"100,000 values \(the limit\)"):
        load_study_file(alias_bomb(tmp_path / "bomb.yaml"))


@pytest.mark.timeout(60)
def test_alias_bomb_dry_run_is_one_line_and_exit_2(tmp_path, capsys):
    bomb = alias_bomb(tmp_path / "bomb.yaml")
    assert main(["bench", "--config", str(bomb), "--workers", "1", "--dry-run"]) == 2
    assert "100,000 values" in one_line_error(capsys)


def test_shared_aliases_within_the_limit_still_work(tmp_path):
    study = tmp_path / "ok.yaml"
    study.write_text("variables:\n  lr: &lr [0.1, 0.2]\n  momentum: *lr\n")
    assert load_study_file(study)["variables"] == {"lr": [0.1, 0.2], "momentum": [0.1, 0.2]}


def test_recursive_alias_is_refused(tmp_path):
    study = tmp_path / "cycle.yaml"
    study.write_text("parameters:\n  model: mlp\n  a: &a [1, *a]\n")
    with pytest.raises(PlanError, match="anchor at line 3 is used by an alias inside itself"):
        load_study_file(study)


@pytest.mark.parametrize("name, text", [
    ("deep.yaml", "parameters:\n  a: " + NESTED + "\n"),
    ("deep.toml", "[parameters]\na = " + NESTED + "\n"),
    ("less.yaml", "parameters:\n  a: " + "[" * 40 + "]" * 40 + "\n"),
    ("less.toml", "[parameters]\na = " + "[" * 40 + "]" * 40 + "\n"),
])
def test_deep_nesting_in_a_study_file_is_refused(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(PlanError, match=r"nested more than 32 levels deep"):
        load_study_file(tmp_path / name)


def test_deep_json_on_the_command_line_is_one_line(capsys):
    for flag in ("-P", "-V"):
        assert main(["bench", "--workers", "1", flag, f"x={NESTED[60_000:140_000]}",
                     "--dry-run"]) == 2
        assert "nested more than 32 levels deep" in one_line_error(capsys)


def test_oversized_study_file_is_refused(tmp_path):
    study = tmp_path / "big.yaml"
    study.write_text("# padding\n" * 110_000 + "parameters: {model: mlp}\n")
    with pytest.raises(PlanError, match=r"larger than 1,048,576 bytes"):
        load_study_file(study)


def test_a_plan_too_large_to_run_is_refused_before_it_is_expanded():
    with pytest.raises(PlanError, match=r"160,000 configurations \(the limit is 100,000\)"):
        build_plan({}, {"a": list(range(400)), "b": list(range(400))})
    with pytest.raises(PlanError, match=r"extension 1's cases make a plan of 120,000"):
        build_plan({}, {"a": list(range(40_000))}, [{"cases": [{"b": 1}, {"b": 2}, {"b": 3}]}])


# --- item 12: a study checks each data set and each model once --------------------------------

def test_a_study_builds_each_data_set_once_and_probes_each_model_once(monkeypatch):
    built = {"data": 0, "model": 0}

    def counting(kind, real):
        def wrapper(*args, **kwargs):
            built[kind] += 1
            return real(*args, **kwargs)
        return wrapper

    from parascale.data import builtin, handover

    monkeypatch.setattr(handover, "_PREPARED", {})  # nothing built earlier in this process
    monkeypatch.setattr(builtin, "build", counting("data", builtin.build))
    monkeypatch.setattr(parascale.models, "build", counting("model", parascale.models.build))
    options = {**TINY, "batch_size": 8}
    del options["model"]
    jobs = make_jobs(combine(options=options, workers="1",
                             variables=[("lr", [0.01, 0.02, 0.03, 0.04]),
                                        ("model", ["mlp", "smallcnn"])]))
    assert len(jobs) == 8
    assert built == {"data": 1, "model": 2}


def test_configurations_with_different_data_are_checked_against_their_own_data():
    with pytest.raises(UsageError, match="synthetic has 48"):
        make_jobs(combine(options={**TINY, "dataset": "synthetic", "batch_size": 64},
                          workers="1", variables=[("synthetic_size", [2048, 48])]))


def test_the_data_key_covers_every_field_a_loader_reads():
    source = "".join(p.read_text() for p in Path(parascale.data.__file__).parent.glob("*.py"))
    read = set(re.findall(r"\bcfg\.([a-z_]+)", source))
    assert read and read <= set(parascale.data.FIELDS), read - set(parascale.data.FIELDS)


# --- item 13: run records that are too deep, too long or of the wrong types --------------------

def hostile_study(tmp_path: Path) -> Path:
    study = write_study(tmp_path / "study", [record(1, 100.0), record(2, 190.0)])
    long = rec("long", 1, 100.0, model="m" * 200_000)
    wrong = rec("wrong", 2, 150.0)
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


def test_dry_run_and_resume_treat_hostile_records_as_not_recorded(tmp_path, capsys):
    study = tmp_path / "study"
    jobs = make_jobs(combine(options={**TINY, "global_batch": 63}, scaling="strong",
                             workers="1,2"))
    assert jobs[1].skip_reason  # files a record without training: resuming reads, then writes
    for job, text in zip(jobs, (NESTED, json.dumps(record(1, 1.0, model="m" * 20_000)))):
        (study / "runs" / job.folder).mkdir(parents=True)
        (study / "runs" / job.folder / "record.json").write_text(text)
    assert existing_records(study, jobs) == {}
    args = ["bench", "--model", "mlp", "--dataset", "digits", "--steps", "2", "--scaling",
            "strong", "--global-batch", "63", "--workers", "1,2", "--out", str(study)]
    assert main([*args, "--dry-run"]) == 0
    assert "already recorded" not in capsys.readouterr().out
    records = run_study(study, jobs[1:])  # the skipped one: no training
    assert records[jobs[1].folder]["status"] == "skipped"


def test_a_hostile_plan_json_is_no_plan_for_report_and_resume(tmp_path, capsys):
    study = tmp_path / "study"
    write_study(study, [record(1, 100.0), record(2, 190.0)])
    (study / "plan.json").write_text(NESTED)  # json.loads alone: RecursionError
    assert main(["report", str(study)]) == 0  # taken whole, as a folder without a plan
    assert "1.90×" in capsys.readouterr().out
    jobs = make_jobs(combine(options={**TINY, "global_batch": 63}, scaling="strong",
                             workers="1,2"))
    records = run_study(study, jobs[1:])  # the skipped one: no training; a plan afresh
    assert records[jobs[1].folder]["status"] == "skipped"


def test_plot_labels_are_short_whatever_the_model_name(tmp_path):
    rows = summary_rows(load_records([write_study(tmp_path / "s", [
        rec("a", 1, 100.0, model="pkg." + "m" * 9_000 + ":build"),
        rec("b", 2, 190.0, model="pkg." + "m" * 9_000 + ":build")])]).records)
    [label] = series_labels([rows[0].key]).values()
    assert len(label) <= 80 and label.startswith("pkg.mmm") and label.endswith(":build")


# --- kin of the above, found in the same files -------------------------------------------------

def test_report_of_something_neither_folder_nor_file_is_one_line(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        assert main(["report", str(path)]) == 2
        assert "is neither a folder nor a file" in one_line_error(capsys)


@pytest.mark.timeout(30)
def test_a_fifo_never_blocks_a_reader(tmp_path):
    os.mkfifo(tmp_path / "study.yaml")
    with pytest.raises(PlanError, match="is not a regular file"):
        load_study_file(tmp_path / "study.yaml")
    jobs = make_jobs(combine(options={**TINY, "batch_size": 8}, workers="1"))
    (tmp_path / "runs" / jobs[0].folder).mkdir(parents=True)
    os.mkfifo(tmp_path / "runs" / jobs[0].folder / "record.json")
    assert existing_records(tmp_path, jobs) == {}
