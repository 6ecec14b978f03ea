"""Every record parascale wrote before stays readable: ``report`` and ``predict`` on real records
of earlier versions (tests/records/README.md says which commit wrote each).

All say schema "parascale.run/1", but their fields grew: no ``timing`` or ``machine`` in the
first, no ``task`` or ``flops`` before tasks, no ``steps.work`` before predict's wait. The
figures the report and predict show must be the record's own, not merely come out without an
exception.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from parascale import record as rec
from parascale.cli.main import main
from parascale.report import load_records, summary_rows, write_loaded

RECORDS = Path(__file__).resolve().parent / "records"
FILES = sorted(RECORDS.glob("*.json")) + sorted(RECORDS.glob("bench-*/runs/*/record.json"))
OK = [f for f in FILES if json.loads(f.read_text())["status"] == "ok"]


def _name(path: Path) -> str:
    return str(path.relative_to(RECORDS))


def _data(path: Path) -> dict:
    return json.loads(path.read_text())


def test_there_is_a_record_of_every_kind():
    names = {_name(f) for f in FILES}
    for kind in ("train-f442537", "failed-", "lm-", "script-", "hpo-", "bench-"):
        assert any(n.startswith(kind) for n in names), kind
    described = (RECORDS / "README.md").read_text()
    assert all(_name(f).split("/")[0] in described for f in FILES)  # each says who wrote it


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_each_record_reads_with_its_status(path):
    data = rec.read_record(path)
    loaded = load_records([path])
    assert loaded.problems == [] and len(loaded.records) == 1
    assert loaded.records[0].status == data["status"]
    if data["status"] != "ok":
        assert loaded.records[0].reason == data["reason"]


@pytest.mark.parametrize("path", OK, ids=_name)
def test_the_report_row_holds_the_records_figures(path):
    data = _data(path)
    summary, derived = data["summary"], data["derived"]
    (row,) = summary_rows(load_records([path]).records)
    assert row.workers == derived["world_size"]
    assert row.per_device_batch == derived["per_device_batch"]
    assert row.throughput == summary["steady_throughput"]
    assert row.epoch_time_s == summary["steady_epoch_time_s"]
    assert row.step_p50_s == data["steps"]["phases"]["step"]["p50"]
    assert row.test_accuracy == summary["final_test_accuracy"]
    task = data.get("task") or {}
    assert (row.unit, row.units_per_sample) == (task.get("unit", "samples"),
                                                task.get("units_per_sample", 1.0))
    assert row.mfu == summary.get("mfu")
    assert row.flops_per_step == summary.get("flops_per_step")
    tta = data.get("time_to_accuracy")
    assert row.tta_runs == (1 if tta else 0)
    if tta and tta["reached"]:
        assert row.tta_s == tta["elapsed_s"] and row.tta_epoch == tta["epoch"]


def test_the_language_models_throughput_is_counted_in_tokens():
    path = RECORDS / "lm-260a6d7.json"
    data = _data(path)
    tokens = data["task"]["units_per_sample"]
    assert tokens == data["derived"]["tokens_per_sample"]
    (row,) = summary_rows(load_records([path]).records)
    assert row.throughput * row.units_per_sample == pytest.approx(
        data["summary"]["steady_tokens_per_s"])


def test_one_report_of_every_record_shows_each_ones_figures(tmp_path):
    loaded = load_records(FILES)
    assert loaded.problems == [] and len(loaded.records) == len(FILES)
    page = write_loaded(loaded, tmp_path).read_text()
    markdown = (tmp_path / "summary.md").read_text()
    with (tmp_path / "summary.csv").open(newline="") as handle:
        csv_rows = {Path(r["source"]).resolve(): r for r in csv.DictReader(handle)}
    for path in OK:
        data = _data(path)
        per = (data.get("task") or {}).get("units_per_sample", 1.0)
        shown = f"{data['summary']['steady_throughput'] * per:,.0f}"
        assert shown in markdown and shown in page, _name(path)
        row = csv_rows[path.resolve()]
        assert float(row["throughput_samples_per_s"]) == data["summary"]["steady_throughput"]
        assert int(row["workers"]) == data["derived"]["world_size"]
    assert "tokens/s" in markdown  # the language model's table, in its unit
    failed = _data(RECORDS / "failed-260a6d7.json")
    assert csv_rows[(RECORDS / "failed-260a6d7.json").resolve()]["status"] == "failed"
    assert failed["reason"] in markdown
    assert "injected fault on rank 1" in page


@pytest.mark.parametrize("path", OK, ids=_name)
def test_predict_takes_its_inputs_from_the_record(path, tmp_path, capsys):
    data = _data(path)
    assert main(["predict", str(path), "--interconnect", "loopback", "--workers", "1,2",
                 "--out", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    prediction = json.loads((tmp_path / "prediction.json").read_text())
    phases = data["steps"]["phases"]
    model = prediction["model"]
    batch = data["derived"]["per_device_batch"]
    compute = phases["data"]["mean"] + phases["compute"]["mean"]
    assert model["work"]["per_sample_s"] * batch == pytest.approx(compute)
    other = phases["step"]["mean"] - compute - phases["sync"]["mean"]
    assert model["work"]["other_s"] == pytest.approx(other)
    if data["derived"]["world_size"] == 2:  # a 2-device ring sends what it exchanges
        assert model["gradient_bytes"] == data["derived"]["bytes_per_step"]
    one = prediction["curves"]["weak"][0]
    assert one["workers"] == 1 and one["work_s"] == pytest.approx(compute + other)
    assert f"{compute * 1e3:.4g} ms at b={batch}" in said
