"""Numbers on the command line, in files and in the environment are read in ASCII digits only.

Python's int(), float(), str.isdigit() and the regular expression \\d all take any Unicode
decimal digit: '５' (fullwidth) and '٣' (Arabic-Indic) were read as 5 and 3, and a run started
on a number no one typed. Every entry point refuses them in one line (exit 2), before any
process starts (this fast tier fails a test that starts one).
"""
from __future__ import annotations

import pytest
from conftest import one_line_error

from parascale.bench.expr import ExprError, evaluate
from parascale.bench.plan import PlanError, parse_workers
from parascale.bench.values import parse_value
from parascale.cli.main import main
from parascale.errors import UsageError

FULLWIDTH, ARABIC_INDIC, DEVANAGARI = "５", "٣", "३"
DIGITS = [FULLWIDTH, ARABIC_INDIC, DEVANAGARI]


def refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    return one_line_error(capsys)


@pytest.mark.parametrize("digit", DIGITS)
@pytest.mark.parametrize("argv", [
    ["train", "--workers", "{d}"],
    ["train", "--epochs", "{d}"],
    ["train", "--lr", "0.{d}"],
    ["train", "--gpus", "{d}"],
    ["train", "--learners", "{d}"],
    ["train", "--batch-size", "1{d}"],
    ["bench", "--repeat", "{d}"],
    ["bench", "--batch-size", "{d}", "--dry-run"],
    ["comm", "--workers", "{d}"],
    ["comm", "--gpus", "{d}"],
    ["find-batch", "--model", "mlp", "--gpus", "{d}"],
    ["find-batch", "--model", "mlp", "--max-batch", "{d}"],
    ["find-batch", "--model", "mlp", "--lr", "{d}"],
    ["hpo", "--out", "x", "--trials", "{d}"],
    ["predict", "x", "--workers", "1,{d}"],
    ["predict", "x", "--ps-servers", "{d}"],
    ["predict", "x", "--noise-scale", "{d}00"],
    ["report", "x", "--target", "0.{d}"],
])
def test_an_option_refuses_a_digit_that_is_not_ascii(capsys, argv, digit):
    error = refused(capsys, *(a.format(d=digit) for a in argv))
    assert "ASCII digits" in error and argv[-1].split("{")[0] in " ".join(argv)
    assert digit in error  # the value is quoted back


@pytest.mark.parametrize("digit", DIGITS)
@pytest.mark.parametrize("option, value", [
    ("--devices", "1,{d}"), ("--memory-limit", "{d}G"),
])
def test_find_batch_lists_and_sizes(capsys, option, value, digit):
    error = refused(capsys, "find-batch", "--model", "mlp", option, value.format(d=digit))
    assert option in error


@pytest.mark.parametrize("digit", DIGITS)
def test_comm_sizes(capsys, digit):
    assert "--sizes" in refused(capsys, "comm", "--sizes", f"1{digit}K")


@pytest.mark.parametrize("digit", DIGITS)
def test_predict_counts(capsys, digit):
    assert "--params" in refused(capsys, "predict", "x", "--params", f"2{digit}M")


@pytest.mark.parametrize("spec", ["{d}", "1,{d}", "1-{d}", "pow2:{d}"])
@pytest.mark.parametrize("digit", DIGITS)
def test_bench_worker_counts(capsys, spec, digit):
    with pytest.raises(PlanError, match="bad workers"):
        parse_workers(spec.format(d=digit), 16)
    assert "bad workers" in refused(capsys, "bench", "--workers", spec.format(d=digit),
                                    "--dry-run")


@pytest.mark.parametrize("digit", DIGITS)
def test_a_study_value_with_such_digits_stays_text(digit):
    """A YAML or KEY=VALUE value '５' is text, which the option's check then refuses."""
    assert parse_value(digit) == digit and parse_value(f"1.{digit}") == f"1.{digit}"
    assert parse_value("5") == 5 and parse_value("1.5") == 1.5


@pytest.mark.parametrize("text", [
    'int("{d}")', 'float("1.{d}")', 'format("{{{d}}}", 1)', 'format("{{0:{d}}}", 1)',
])
@pytest.mark.parametrize("digit", DIGITS)
def test_study_expressions(text, digit):
    with pytest.raises(ExprError, match="ASCII"):
        evaluate(text.format(d=digit), {})
    assert evaluate('int("12") + float("0.5")', {}) == 12.5


@pytest.mark.parametrize("digit", DIGITS)
def test_the_fault_plan(monkeypatch, digit):
    from parascale.runtime import faults

    for text in (f"kill@{digit}:1", f"kill@0:{digit}", f"oom@{digit}", f"raise@0:1/{digit}"):
        with pytest.raises(UsageError, match="cannot read"):
            faults.parse(text)
    assert faults.parse("kill@0:1") == [("kill", 0, 1.0)]


@pytest.mark.parametrize("digit", DIGITS)
def test_slurm_task_counts_from_the_environment(digit):
    """srun's variables: a count that is not ASCII is not read as one (left unchecked, like a
    variable srun did not set), never taken as the number it looks like."""
    from parascale.runtime.world import _tasks_on_node, check_tasks

    assert _tasks_on_node(f"{digit}", 0) is None
    assert _tasks_on_node(f"2(x{digit})", 0) is None
    assert _tasks_on_node("2(x3),1", 3) == 1
    check_tasks({"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": digit},
                "cpu", 0)
    with pytest.raises(UsageError, match="srun started 2 tasks"):
        check_tasks({"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "3"},
                    "cpu", 0)


def test_ascii_numbers_still_read(capsys):
    from parascale.digits import ascii_float, ascii_int, int_list

    assert ascii_int(" 12 ") == 12 and ascii_int("-3") == -3
    assert ascii_float("1e-3") == 0.001 and ascii_float(".5") == 0.5 and ascii_float("5") == 5
    assert int_list("0, 1,3") == (0, 1, 3)
    for bad in ("1_0", "", "0x10", "١٢"):
        with pytest.raises(Exception, match="ASCII"):
            ascii_int(bad)


@pytest.mark.parametrize("digit", DIGITS)
def test_study_parameters_and_files(capsys, tmp_path, digit):
    """-P and a study file: such a value stays text (a GPU list is not read from it either),
    which the option's own check refuses."""
    assert main(["bench", "-P", f"gpus=0,{digit}", "--workers", "1", "--dry-run"]) == 2
    assert "gpus must be a list of integers" in one_line_error(capsys)
    study = tmp_path / "study.yaml"
    study.write_text(f"parameters:\n  batch_size: {digit}\n  steps: 2\n", encoding="utf-8")
    assert main(["bench", "--config", str(study), "--workers", "1", "--dry-run"]) == 2
    assert "batch_size must be an integer" in one_line_error(capsys)
