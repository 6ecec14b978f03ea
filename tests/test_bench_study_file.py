"""Study files and study folders someone else may have written: duplicate keys, YAML aliases and
recursion, deep nesting, size, plans too large to expand, files that are not regular files, and
hostile run records or plan.json; each refused in one line, or read as not recorded."""

import json
import os
from pathlib import Path

import pytest

from conftest import one_line_error, record, write_study
from helpers import NESTED, TINY
from parascale.bench.plan import PlanError, build_plan
from parascale.bench.studyfile import load_study_file
from parascale.bench.runner import existing_records, run_study
from parascale.bench.study import combine, make_jobs
from parascale.cli.main import main


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


@pytest.mark.timeout(30)
def test_a_fifo_never_blocks_a_reader(tmp_path):
    os.mkfifo(tmp_path / "study.yaml")
    with pytest.raises(PlanError, match="is not a regular file"):
        load_study_file(tmp_path / "study.yaml")
    jobs = make_jobs(combine(options={**TINY, "batch_size": 8}, workers="1"))
    (tmp_path / "runs" / jobs[0].folder).mkdir(parents=True)
    os.mkfifo(tmp_path / "runs" / jobs[0].folder / "record.json")
    assert existing_records(tmp_path, jobs) == {}


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
