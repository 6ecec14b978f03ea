"""Report tables against hand computations on fixed records (no training: records are written here).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from parascale.errors import UsageError
from parascale.report import format_terminal, load_records, summary_rows, write_report
from parascale.cli import report_cmd as command
from parascale.report.tables import format_csv, format_markdown
from parascale.report.wording import sentences

from conftest import machine_block, record, write_study
from helpers import repeats, rows_of, with_ids


# ---- helpers (record and write_study live in conftest.py, shared) --------------------------

def rows_for(tmp_path: Path, records: list[dict[str, Any]]):
    return summary_rows(load_records([write_study(tmp_path / "study", records)]).records)


def by_n(rows) -> dict:
    return {r.workers: r for r in rows}


# ---- speedup and efficiency -------------------------------------------------------------------

def test_weak_scaling_matches_dlbs_published_example(tmp_path):
    # DLBS ResNet50, batch 16 per GPU: batch times 913.44 / 1029.24 / 1065.12 ms,
    # efficiency 100 / 88.74 / 85.75 %
    times = {1: 0.91344, 2: 1.02924, 4: 1.06512}
    rows = by_n(rows_for(tmp_path, [record(n, n * 16 / t, batch=16) for n, t in times.items()]))
    assert rows[2].efficiency == pytest.approx(0.91344 / 1.02924)
    assert round(100 * rows[2].efficiency, 2) == 88.75  # DLBS truncates to 88.74
    assert round(100 * rows[4].efficiency, 2) == 85.76  # DLBS: 85.75
    assert rows[2].speedup == pytest.approx(2 * 0.91344 / 1.02924)
    assert rows[4].per_device_throughput == pytest.approx(16 / 1.06512)
    assert rows[1].speedup == 1 and rows[1].efficiency == 1
    assert rows[2].formula == "E = t1/tN (t = time per step, per-device batch fixed)"


def test_strong_scaling_matches_bsc_epoch_times(tmp_path):
    # BSC ResNet50V2: 14 / 8 / 5 s per epoch on 1 / 2 / 4 GPUs -> efficiency 87.5 / 70 %
    recs = [record(n, epoch_time=t, scaling="strong", global_batch=256)
            for n, t in {1: 14.0, 2: 8.0, 4: 5.0}.items()]
    rows = by_n(rows_for(tmp_path, recs))
    assert rows[2].efficiency == pytest.approx(0.875)
    assert rows[4].efficiency == pytest.approx(0.70)
    assert rows[4].speedup == pytest.approx(14 / 5)
    assert rows[4].epoch_time_s == pytest.approx(5.0)
    assert rows[4].formula == "E = t1/(N·tN) (t = time per step, global batch fixed)"


def test_super_linear_is_not_capped(tmp_path):
    rows = by_n(rows_for(tmp_path, [record(1, 100.0), record(2, 250.0)]))
    assert rows[2].speedup == pytest.approx(2.5)
    assert rows[2].efficiency == pytest.approx(1.25)
    text = format_terminal(list(rows.values()))
    assert "125.0%" in text
    [sentence] = sentences(list(rows.values()))
    assert "2 workers reach 2.50× the throughput of 1 (efficiency 125%)" in sentence
    assert "Super-linear" in sentence


def test_reference_is_smallest_n_without_a_one_worker_run(tmp_path):
    rows = by_n(rows_for(tmp_path, [record(2, 200.0), record(4, 360.0), record(8, 640.0)]))
    assert {r.reference_workers for r in rows.values()} == {2}
    # the reference's own speedup would only restate an assumption: not shown as measured
    assert rows[2].speedup is None and rows[2].efficiency is None
    # no speedup over one worker is claimed without one: only the measured ratio, said so
    assert rows[4].speedup is None and rows[4].ratio == pytest.approx(360 / 200)
    assert rows[8].efficiency == pytest.approx(2 * 640 / 200 / 8)
    text = format_terminal(list(rows.values()))
    assert "relative to 2 workers" in text and "1.80× vs 2" in text and "3.60" not in text
    [sentence] = sentences(list(rows.values()))
    assert "8 workers reach 3.20× the throughput of 2 workers (efficiency 80% relative to 2 workers)" in sentence


def test_low_efficiency_gets_a_note(tmp_path):
    rows = rows_for(tmp_path, [record(1, 100.0), record(4, 160.0)])
    [sentence] = sentences(rows)
    assert "efficiency 40%" in sentence and "Below 50%" in sentence


def test_repeats_use_median_and_show_spread(tmp_path):
    recs = [record(1, x, repeat=i) for i, x in enumerate([100.0, 110.0, 90.0])]
    recs += [record(2, x, repeat=i) for i, x in enumerate([180.0, 170.0, 200.0])]
    rows = by_n(rows_for(tmp_path, recs))
    assert rows[1].runs == 3 and rows[1].throughput == 100.0
    assert (rows[1].throughput_min, rows[1].throughput_max) == (90.0, 110.0)
    assert rows[2].throughput == 180.0 and rows[2].speedup == pytest.approx(1.8)
    assert rows[2].epoch_time_s == pytest.approx(1400 / 180)
    assert rows[2].epoch_time_min_s == pytest.approx(1400 / 200)
    line = [ln for ln in format_terminal(list(rows.values())).splitlines() if ln.strip().startswith("2 ")][0]
    assert "180 (170–200)" in line and " 3 " in line


def test_sync_cost_against_baseline(tmp_path):
    recs = [record(1, 100.0), record(2, 180.0, step_p50=0.020),
            record(2, 200.0, baseline=True, step_p50=0.018)]
    rows = rows_for(tmp_path, recs)
    assert [r.workers for r in rows] == [1, 2]  # the baseline is not a scaling row
    two = by_n(rows)[2]
    assert two.sync_cost == pytest.approx(0.10)
    assert two.sync_step_delta_s == pytest.approx(0.002)
    assert by_n(rows)[1].sync_cost is None
    assert "10.0% (+2.0 ms/step)" in format_terminal(rows)
    assert "Gradient exchange costs 10% of throughput at N=2" in sentences(rows)[0]


def test_step_accuracy_and_time_to_accuracy(tmp_path):
    recs = [record(1, 100.0, step_p50=0.30, step_p95=0.45, accuracy=0.93,
                   tta={"target": 0.9, "reached": True, "epoch": 3, "elapsed_s": 4.2}),
            record(2, 190.0, tta={"target": 0.9, "reached": False, "epoch": None, "elapsed_s": None}),
            record(4, 300.0)]
    rows = by_n(rows_for(tmp_path, recs))
    assert (rows[1].step_p50_s, rows[1].step_p95_s) == (0.30, 0.45)
    assert rows[1].test_accuracy == 0.93 and rows[1].tta_s == 4.2 and rows[1].tta_epoch == 3
    text = format_terminal(list(rows.values()))
    assert "300" in text and "450" in text and "93.0%" in text  # step times shown in ms
    assert "4.20 s (epoch 3)" in text and "not reached" in text


def test_groups_by_model_and_scaling(tmp_path):
    recs = [record(1, 100.0), record(2, 190.0), record(1, 50.0, model="resnet"),
            record(2, 60.0, model="resnet"), record(2, 150.0, scaling="strong", global_batch=64)]
    rows = rows_for(tmp_path, recs)
    keys = {(r.key.model, r.key.scaling) for r in rows}
    assert keys == {("smallcnn", "weak"), ("resnet", "weak"), ("smallcnn", "strong")}
    resnet = {r.workers: r for r in rows if r.key.model == "resnet"}
    assert resnet[2].efficiency == pytest.approx(60 / 100)


# ---- unfinished and unreadable runs -----------------------------------------------------------

def test_failed_oom_skipped_and_junk_are_listed_with_reasons(tmp_path):
    study = write_study(tmp_path / "study", [
        record(1, 100.0), record(2, 190.0),
        record(4, status="oom", reason="cuda:0 out of memory at per-device batch 32"),
        record(8, status="failed", reason="rank 3: RuntimeError: boom"),
        record(16, status="skipped", reason="only 8 cores"),
    ])
    (study / "runs" / "junk").mkdir()
    (study / "runs" / "junk" / "record.json").write_text(json.dumps({"hello": "world"}))
    (study / "runs" / "torn").mkdir()
    (study / "runs" / "torn" / "record.json").write_text('{"schema": "parascale.run/1", "sta')
    (study / "runs" / "interrupted").mkdir()
    loaded = load_records([study])
    rows = summary_rows(loaded.records)
    assert [r.workers for r in rows] == [1, 2]
    assert {r.status for r in loaded.unfinished} == {"oom", "failed", "skipped"}
    kinds = {p.path.parent.name if p.path.name == "record.json" else p.path.name: p.kind
             for p in loaded.problems}
    assert kinds == {"junk": "invalid", "torn": "unreadable", "interrupted": "missing"}
    text = format_terminal(rows, loaded.unfinished, loaded.problems)
    for reason in ("out of memory at per-device batch 32", "rank 3: RuntimeError: boom",
                   "only 8 cores", "not a parascale run record", "unreadable", "did not finish"):
        assert reason in text
    table = list(csv.DictReader(io.StringIO(format_csv(rows, loaded.unfinished, loaded.problems))))
    assert {r["status"] for r in table} == {"ok", "oom", "failed", "skipped", "invalid",
                                            "unreadable", "missing"}
    assert "Not finished: N=4 (oom), N=8 (failed), N=16 (skipped)." in sentences(rows, loaded.unfinished)[0]


def test_a_group_where_nothing_finished_still_gets_a_sentence(tmp_path):
    loaded = load_records([write_study(tmp_path / "s", [
        record(1, 100.0), record(1, model="big", status="oom", reason="no memory")])])
    said = sentences(summary_rows(loaded.records), loaded.unfinished)
    assert any(s.startswith("big on digits, weak scaling: no configuration finished") for s in said)


def test_ok_record_without_figures_is_a_problem_not_a_crash(tmp_path):
    bad = record(2, 100.0)
    bad["summary"]["steady_throughput"] = None
    loaded = load_records([write_study(tmp_path / "s", [record(1, 100.0), bad])])
    assert len(loaded.records) == 1
    assert "summary.steady_throughput" in loaded.problems[0].reason


def test_bad_paths_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_records([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no run records"):
        load_records([tmp_path / "empty"])
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a parascale run record"):
        load_records([tmp_path / "x.json"])


def test_plain_train_outputs_and_record_files(tmp_path):
    for n, x in ((1, 100.0), (2, 180.0)):
        (tmp_path / f"n{n}").mkdir()
        (tmp_path / f"n{n}" / "record.json").write_text(json.dumps(record(n, x, study=False)))
    # a folder of train outputs, and the same runs named one by one
    for paths in ([tmp_path], [tmp_path / "n1", tmp_path / "n2" / "record.json"]):
        loaded = load_records(paths)
        assert len(loaded.records) == 2
    rows = by_n(summary_rows(load_records([tmp_path]).records))
    assert rows[2].mode == "weak" and rows[2].inferred  # per-device batch fixed
    assert rows[2].efficiency == pytest.approx(0.9)


def test_markdown_and_csv(tmp_path):
    rows = rows_for(tmp_path, [record(1, 100.0, model="a|b"), record(2, 150.0, model="a|b")])
    md = format_markdown(rows)
    assert "| workers | runs |" in md and "a\\|b" in md and "75.0%" in md
    [one, two] = list(csv.DictReader(io.StringIO(format_csv(rows))))
    assert float(two["efficiency"]) == pytest.approx(0.75)
    assert float(two["speedup"]) == pytest.approx(1.5)
    assert two["efficiency_formula"].startswith("E = t1/tN")


# ---- the command ------------------------------------------------------------------------------

def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_command_writes_report_and_prints_table(tmp_path, capsys):
    study = write_study(tmp_path / "study", [record(1, 100.0), record(2, 190.0)])
    assert command.run(_parse(["report", str(study)])) == 0
    out = capsys.readouterr().out
    assert "95.0%" in out and str(study / "report" / "report.html") in out
    for name in ("report.html", "summary.csv", "summary.md", "throughput.png", "speedup.svg"):
        assert (study / "report" / name).stat().st_size > 0
    assert not list((study / "report").glob(".*tmp"))  # atomic writes leave no temporaries


def test_command_bad_input_writes_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UsageError):
        command.run(_parse(["report", str(tmp_path / "missing"), "--out", str(out)]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError):
        command.run(_parse(["report", str(tmp_path / "empty"), "--out", str(out)]))
    assert not out.exists()


def test_cli_exit_code_2_on_bad_input(tmp_path, capsys):
    from parascale.cli.main import main
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err


def test_write_report_several_studies_to_explicit_out(tmp_path):
    a = write_study(tmp_path / "a", [record(1, 100.0), record(2, 190.0)])
    b = write_study(tmp_path / "b", [record(1, 90.0), record(2, 150.0)])
    html = write_report([a, b], tmp_path / "both")
    assert html == tmp_path / "both" / "report.html"
    table = list(csv.DictReader((tmp_path / "both" / "summary.csv").open()))
    assert {(r["study"], r["workers"]) for r in table} == {("a", "1"), ("a", "2"), ("b", "1"), ("b", "2")}
    assert not (a / "report").exists()  # --out given: nothing written next to the studies


# ---- series: a sweep is not a set of repeats ----------------------------------------------------

def test_a_batch_sweep_makes_one_series_per_batch_not_repeats(tmp_path):
    records = []
    for batch, x1 in ((16, 1000.0), (64, 3000.0)):
        for n in (1, 2):
            rec = record(n, x1 * n * 0.8 if n > 1 else x1, batch=batch)
            rec["study"]["config_id"] += f"-b{batch}"
            records.append(rec)
    rows = rows_for(tmp_path, records)
    assert [(r.key.variant, r.workers, r.runs) for r in rows] == [
        ("batch 16 per device", 1, 1), ("batch 16 per device", 2, 1),
        ("batch 64 per device", 1, 1), ("batch 64 per device", 2, 1)]
    assert all(r.efficiency == pytest.approx(0.8) for r in rows if r.workers == 2)


def test_a_differing_setting_labels_its_series_and_baselines_follow_it(tmp_path):
    records = []
    for lr, x2 in ((0.05, 1800.0), (0.1, 1500.0)):
        for n, x, base in ((1, 1000.0, False), (2, x2, False), (2, 1900.0, True)):
            rec = record(n, x, baseline=base, sync="none" if base else "allreduce")
            rec["config"]["lr"] = lr
            rec["study"]["config_id"] += f"-lr{lr}"
            records.append(rec)
    rows = {(r.key.variant, r.workers): r for r in rows_for(tmp_path, records)}
    assert set(rows) == {("lr=0.05", 1), ("lr=0.05", 2), ("lr=0.1", 1), ("lr=0.1", 2)}
    assert rows[("lr=0.1", 2)].sync_cost == pytest.approx(1 - 1500 / 1900)
    assert rows[("lr=0.05", 2)].sync_cost == pytest.approx(1 - 1800 / 1900)


def test_a_strategys_options_split_its_series_but_a_baseline_without_them_still_matches(
        tmp_path):
    """Records state the options of their own strategy only (issue 31): the baseline's lack of
    allreduce's is no difference, a differing period of local SGD is."""
    records = []
    for sync, options, x in (("allreduce", {"bucket_mb": 25.0, "compression": "none"}, 1800.0),
                             ("none", {}, 1900.0), ("local-sgd", {"period": 4}, 1700.0),
                             ("none", {"period": 4}, 1950.0), ("local-sgd", {"period": 8}, 1750.0)):
        for n in (1, 2):  # (a baseline keeps the options it ignores: bench gives it the run's)
            rec = record(n, x if n == 2 else 1000.0, baseline=sync == "none", sync=sync)
            rec["config"].update(options)
            rec["study"]["config_id"] += f"-{sync}-{options.get('period')}"
            records.append(rec)
    rows = {(r.key.sync, r.key.variant, r.workers): r for r in rows_for(tmp_path, records)}
    assert {(sync, variant) for sync, variant, _ in rows} == \
        {("allreduce", ""), ("local-sgd", "period=4"), ("local-sgd", "period=8")}
    assert rows[("allreduce", "", 2)].sync_cost == pytest.approx(1 - 1800 / 1900)
    assert rows[("local-sgd", "period=4", 2)].sync_cost == pytest.approx(1 - 1700 / 1950)
    assert rows[("local-sgd", "period=8", 2)].baseline_throughput is None


def test_one_series_has_no_variant_label(tmp_path):
    rows = rows_for(tmp_path, [record(1, 1000.0), record(2, 1900.0)])
    assert {r.key.variant for r in rows} == {""}


def test_terminal_tables_fit_120_columns(tmp_path):
    tta = {"target": 0.9, "reached": True, "epoch": 3, "elapsed_s": 14.2}
    records = []
    for n, xs in ((1, [1010.0, 1000.0, 990.0]), (2, [1500.0, 1440.0, 1380.0]),
                  (4, [2600.0, 2500.0, 2300.0])):
        records += repeats(n, xs, tta=tta, machine=machine_block() if n == 4 else None)
        if n > 1:
            records += repeats(n, [x * 1.1 for x in xs], baseline=True, sync="none", tta=tta)
    rows = rows_of(tmp_path, with_ids(records))
    text = format_terminal(rows)
    wide = [line for line in text.splitlines() if len(line) > 120]
    assert not wide, "\n".join(wide)
    for header in ("speedup", "efficiency", "lost: sharing", "sync cost", "time to 90%"):
        assert header in text  # wrapped, not dropped
