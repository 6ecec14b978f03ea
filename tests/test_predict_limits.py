"""``parascale predict`` refuses figures out of range, from the command line or from a record (one
line naming the record and the field, exit 2, nothing written), prints huge figures compactly,
and draws no time-to-accuracy from a noise scale too imprecise to advise from."""
from __future__ import annotations

import json
import re

import pytest

from conftest import one_line_error, record, write_study
from parascale.cli.main import main
from parascale.predict import Options, predict


def timed(workers: int, compute: float = 0.03, **extra) -> dict:
    """A record whose steady phase means are ``compute`` and 2 ms of optimizer, in seconds."""
    rec = record(workers, 1000.0 * workers, **extra)
    step = compute + 0.002
    rec["steps"]["phases"] = {
        "step": {"p50": step, "p95": step, "max": step, "mean": step},
        "compute": {"p50": compute, "p95": compute, "max": compute, "mean": compute},
        "optimizer": {"p50": 0.002, "p95": 0.002, "max": 0.002, "mean": 0.002}}
    rec["derived"]["bytes_per_step"] = int(2 * (workers - 1) / workers * 4e6)
    return rec


def refused(capsys, tmp_path, study, *args: str) -> str:
    out = tmp_path / "out"
    assert main(["predict", str(study), "--out", str(out), *args]) == 2
    assert not out.exists()
    return one_line_error(capsys)


def test_a_huge_bytes_per_step_names_the_record_and_the_field(tmp_path, capsys):
    two = timed(2)
    two["derived"]["bytes_per_step"] = 1e308  # was an OverflowError
    study = write_study(tmp_path / "s", [timed(1), two])
    error = refused(capsys, tmp_path, study, "--interconnect", "pcie")
    assert "derived.bytes_per_step is 1e+308" in error
    assert "smallcnn-weak-allreduce-n2-r0/record.json" in error


@pytest.mark.parametrize("field, value", [("compute", -0.5), ("step", -1.0), ("step", 1e300)])
def test_negative_or_absurd_step_times_are_refused(tmp_path, capsys, field, value):
    rec = timed(1)
    rec["steps"]["phases"][field]["mean"] = value
    study = write_study(tmp_path / "s", [rec])
    error = refused(capsys, tmp_path, study, "--interconnect", "pcie", "--params", "1M")
    assert f"steps.phases.{field}.mean is {value!r}" in error and "record.json" in error


@pytest.mark.parametrize("option, value", [
    ("--noise-scale", "inf"), ("--noise-scale", "nan"), ("--noise-scale", "1e300"),
    ("--overlap", "nan"), ("--workers", "1,100000000"), ("--params", "1e300"),
    ("--gradient-bytes", "1e300"), ("--batch-size", str(10 ** 30)), ("--period", "0")])
def test_non_finite_or_out_of_range_options_are_one_line(tmp_path, capsys, option, value):
    study = write_study(tmp_path / "s", [timed(1)])
    size = [] if option in ("--params", "--gradient-bytes") else ["--params", "1M"]
    error = refused(capsys, tmp_path, study, "--interconnect", "pcie", *size, option, value)
    assert error.startswith(f"parascale: error: {option}") or f"{option} " in error


def test_an_absurd_comm_row_names_its_field(tmp_path, capsys):
    rows = [{"op": "allreduce", "bytes": s, "time_s": 40e-6 + s * 1e-9} for s in (1024, 1 << 20)]
    rows.append({"op": "allreduce", "bytes": 16 << 20, "time_s": 1e300})
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "comm.json").write_text(json.dumps({
        "schema": "parascale.comm/1", "status": "ok", "world_size": 2, "results": rows}))
    study = write_study(tmp_path / "s", [timed(1)])
    error = refused(capsys, tmp_path, study, "--comm", str(tmp_path / "c"), "--params", "1M")
    assert "results[2].time_s is 1e+300" in error


def test_huge_figures_in_range_print_compactly(tmp_path, capsys):
    # half a million seconds of compute per step on ten million devices: every figure finite
    study = write_study(tmp_path / "s", [timed(1, compute=5e5)])
    code = main(["predict", str(study), "--interconnect", "25gbe", "--params", "2e14",
                 "--workers", "1,10000000", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    assert max(len(d) for d in re.findall(r"\d+", out)) <= 12, out
    json.loads((tmp_path / "out" / "prediction.json").read_text())


def noisy(value: float, se: float | None, steps: int | None) -> dict:
    rec = timed(1)
    rec["epochs"][-1].update(noise_scale=value, noise_scale_se=se, noise_steps=steps)
    return rec


def test_an_imprecise_noise_scale_gives_no_time_to_accuracy_and_says_why(tmp_path):
    study = write_study(tmp_path / "s", [noisy(692.0, 326.0, 40)])
    pred = predict(Options([str(study)], interconnect="pcie", workers=(1, 4), params=1e6))
    assert pred.model.noise_scale is None
    assert pred.curves["weak"][1].tta_speedup is None
    note = " ".join(pred.notes)
    assert "not measured precisely enough" in note and "about 143 steps" in note


def test_a_precise_noise_scale_is_used(tmp_path):
    study = write_study(tmp_path / "s", [noisy(812.0, 61.0, 40)])
    pred = predict(Options([str(study)], interconnect="pcie", workers=(1, 4), params=1e6))
    assert pred.model.noise_scale == 812.0 and pred.curves["weak"][1].tta_speedup is not None
    assert not any("precise" in n for n in pred.notes)
