"""Studies and reports a user can trust: no invented speedup, noise said as noise, contention
warned about, lost efficiency explained, one plan per study folder, runs in rounds.

Report tests write records with stated figures (conftest.record); the tests that start training
processes are short (mlp on digits, two steps) and marked slow.
"""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import machine_block, record, run_chromium, write_study
from parascale.cli.main import main
from parascale.report import format_terminal, load_records, summary_rows, write_report
from parascale.report.tables import format_csv
from parascale.report.wording import sentences


def rows_of(tmp_path: Path, records: list[dict]):
    loaded = load_records([write_study(tmp_path / "study", records)])
    return summary_rows(loaded.records)


def repeats(n: int, throughputs: list[float], **options) -> list[dict]:
    """One record per repeat of N workers, with the stated steady throughputs."""
    return [record(n, x, repeat=i, **options) for i, x in enumerate(throughputs, 1)]


def _with_ids(records: list[dict]) -> list[dict]:
    """Distinct run folders for repeats (the helper's config ids name the repeat)."""
    for i, rec in enumerate(records):
        rec["study"]["config_id"] += f"-{i}"
    return records


# ---- 1. no invented speedup ------------------------------------------------------------------

def test_bare_bench_plans_a_scaling_study_with_a_one_worker_reference(tmp_path, capsys):
    study = tmp_path / "bare"
    assert main(["bench", "--model", "mlp", "--steps", "2", "--dry-run", "--out", str(study)]) == 0
    out = capsys.readouterr().out
    assert "weak scaling study" in out and "workers-1__" in out, out  # a 1-worker run is planned
    assert not study.exists()


def test_one_configuration_shows_no_speedup_and_says_what_is_missing(tmp_path):
    rows = rows_of(tmp_path, [record(2, 400.0)])
    text = format_terminal(rows)
    assert "2.00×" not in text and "100.0%" not in text, text
    assert rows[0].speedup is None and rows[0].efficiency is None
    [sentence] = sentences(rows)
    assert "nothing to compare against" in sentence and "--workers 1,2" in sentence


def test_the_note_before_a_plan_without_one_worker_promises_no_speedup():
    from types import SimpleNamespace

    from parascale.bench.study import reference_warning

    jobs = [SimpleNamespace(world_size=n, skip_reason=None) for n in (2, 4)]
    note = reference_warning(jobs)
    assert "no speedup" in note and "relative to 2 workers" in note
    assert "scaled perfectly" not in note  # the old note promised a speedup on that assumption
    assert reference_warning([SimpleNamespace(world_size=1, skip_reason=None)]) is None


@pytest.mark.slow
def test_bare_bench_summary_never_invents_a_speedup(tmp_path, capsys):
    """The user's case: bench with no study options, then its summary."""
    study = tmp_path / "bare"
    assert main(["bench", "--model", "mlp", "--steps", "2", "--timeout", "60",
                 "--out", str(study)]) == 0
    out = capsys.readouterr().out
    assert "assumes those scaled perfectly" not in out and "relative to 2 workers" not in out
    found = [json.loads(p.read_text()) for p in study.glob("runs/*/record.json")]
    assert {r["derived"]["world_size"] for r in found} >= {1}
    assert "weak scaling" in out and "the throughput of 1" in out  # the verdict, measured


# ---- 3. noise ----------------------------------------------------------------------------------

def test_a_difference_inside_the_spread_is_within_noise(tmp_path):
    # the weak study: 2 workers ranged 317-481 samples/s
    rows = rows_of(tmp_path, _with_ids(repeats(1, [410.0, 412.0, 415.0])
                                       + repeats(2, [317.0, 400.0, 481.0])))
    two = {r.workers: r for r in rows}[2]
    assert two.ratio == pytest.approx(400 / 412)
    assert two.ratio_range == pytest.approx((317 / 415, 481 / 410))  # [min/max, max/min]
    [sentence] = sentences(rows)
    assert "within noise" in sentence and "no speedup or slowdown is measurable" in sentence
    assert "0.76–1.17×" in sentence and "over 3 runs each" in sentence
    line = next(ln for ln in format_terminal(rows).splitlines() if ln.strip().startswith("2 "))
    assert "0.97× (0.76–1.17)~" in line


def test_one_run_per_configuration_takes_its_spread_from_its_steady_epochs(tmp_path):
    rows = rows_of(tmp_path, [record(1, 410.0, epoch_throughputs=[400.0, 410.0, 420.0]),
                              record(2, 430.0, epoch_throughputs=[380.0, 430.0, 450.0])])
    two = {r.workers: r for r in rows}[2]
    assert (two.spread.source, two.spread.n, two.spread.low, two.spread.high) == (
        "epochs", 3, 380.0, 450.0)
    assert two.ratio_range == pytest.approx((380 / 420, 450 / 400))
    assert "within noise" in sentences(rows)[0]
    assert "1 (3 ep)" in format_terminal(rows)


def test_a_slowdown_is_said_as_slower(tmp_path):
    rows = rows_of(tmp_path, _with_ids(repeats(1, [490.0, 500.0, 510.0])
                                       + repeats(2, [290.0, 300.0, 310.0])))
    [sentence] = sentences(rows)
    assert "2 workers are slower than 1: 0.60× its throughput" in sentence, sentence
    assert "reach" not in sentence


def test_a_negative_sync_cost_inside_the_noise_is_not_measurable(tmp_path):
    records = repeats(1, [500.0, 505.0, 510.0]) + repeats(2, [380.0, 400.0, 420.0])
    records += repeats(2, [370.0, 396.0, 420.0], baseline=True, sync="none")
    rows = rows_of(tmp_path, _with_ids(records))
    two = {r.workers: r for r in rows}[2]
    assert two.sync_cost == pytest.approx(1 - 400 / 396)  # -1%
    [sentence] = sentences(rows)
    assert "not measurable here" in sentence and "within noise" in sentence
    assert "costs -1%" not in sentence and "Gradient exchange costs" not in sentence
    assert "~" in next(ln for ln in format_terminal(rows).splitlines()
                       if ln.strip().startswith("2 ") and "%" in ln)


# ---- lost efficiency -------------------------------------------------------------------------

def test_lost_efficiency_is_split_into_sharing_and_exchange(tmp_path):
    # E = 1440/(2*1000) = 72%; baseline 1600: sharing 1 - 1600/2000 = 20 points, exchange
    # (1600 - 1440)/2000 = 8 points
    rows = rows_of(tmp_path, [record(1, 1000.0), record(2, 1440.0),
                              record(2, 1600.0, baseline=True, sync="none")])
    two = {r.workers: r for r in rows}[2]
    assert two.efficiency == pytest.approx(0.72)
    assert two.contention_loss == pytest.approx(0.20)
    assert two.exchange_loss == pytest.approx(0.08)
    [sentence] = sentences(rows)
    assert ("Of the 28% lost at N=2, 20 points is 2 processes sharing the machine, 8 points is "
            "gradient exchange.") in sentence, sentence
    text = format_terminal(rows)
    assert "1,600" in text and "20 pts" in text and "8 pts" in text  # the baseline's throughput
    [one, row] = list(csv.DictReader(io.StringIO(format_csv(rows))))
    assert float(row["contention_loss"]) == pytest.approx(0.20)
    assert float(row["exchange_loss"]) == pytest.approx(0.08)


def test_a_lost_share_inside_the_noise_says_so(tmp_path):
    records = repeats(1, [990.0, 1000.0, 1010.0]) + repeats(2, [1400.0, 1440.0, 1480.0])
    records += repeats(2, [1420.0, 1460.0, 1600.0], baseline=True, sync="none")
    rows = rows_of(tmp_path, _with_ids(records))
    [sentence] = sentences(rows)
    assert "points is gradient exchange (within noise" in sentence, sentence


# ---- contention ------------------------------------------------------------------------------

def test_runs_on_a_busy_machine_are_warned_about(tmp_path):
    busy = machine_block(other=0.95, command="python -m parascale train --workers 2", pid=777)
    records = [record(1, 1000.0, machine=machine_block(busy=False, other=0.02)),
               record(2, 1500.0, machine=busy), record(4, 2000.0)]  # the last: no machine block
    records[2]["machine"] = None  # an older or failed record: handled
    rows = rows_of(tmp_path, records)
    said = sentences(rows)
    assert said[0].startswith("Warning: 1 of 3 runs ran on a busy machine"), said[0]
    assert "0.95 cores" in said[0] and "python -m parascale train --workers 2" in said[0]
    text = format_terminal(rows)
    assert "N=2" in text and "0.95 other cores of 2" in text and "pid 777" in text
    page = write_report([tmp_path / "study"]).read_text()
    assert "ran on a busy machine" in page and "pid 777" in page


# ---- order -----------------------------------------------------------------------------------

def test_repeats_run_in_rounds_across_the_demos_weak_and_strong_studies():
    from parascale.cli.demo_cmd import REPEAT, demo_jobs

    jobs = demo_jobs(quick=False)
    assert [j.repeat for j in jobs] == sorted(j.repeat for j in jobs), \
        [(j.scaling, j.repeat) for j in jobs]
    first = [j for j in jobs if j.repeat == 1]
    assert {j.scaling for j in first} == {"weak", "strong"}
    # every round runs the same configurations in the same order (ABAB...)
    rounds = [[j.config_id for j in jobs if j.repeat == k] for k in range(1, REPEAT + 1)]
    assert all(r == rounds[0] for r in rounds)


def test_the_quick_demo_has_a_folder_of_its_own():
    from parascale.cli.demo_cmd import default_folder

    assert default_folder(quick=True) != default_folder(quick=False)


# ---- width -----------------------------------------------------------------------------------

def test_terminal_tables_fit_120_columns(tmp_path):
    tta = {"target": 0.9, "reached": True, "epoch": 3, "elapsed_s": 14.2}
    records = []
    for n, xs in ((1, [1010.0, 1000.0, 990.0]), (2, [1500.0, 1440.0, 1380.0]),
                  (4, [2600.0, 2500.0, 2300.0])):
        records += repeats(n, xs, tta=tta, machine=machine_block() if n == 4 else None)
        if n > 1:
            records += repeats(n, [x * 1.1 for x in xs], baseline=True, sync="none", tta=tta)
    rows = rows_of(tmp_path, _with_ids(records))
    text = format_terminal(rows)
    wide = [line for line in text.splitlines() if len(line) > 120]
    assert not wide, "\n".join(wide)
    for header in ("speedup", "efficiency", "lost: sharing", "sync cost", "time to 90%"):
        assert header in text  # wrapped, not dropped


# ---- plans -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_changed_plan_in_a_reused_folder_is_said_and_kept_apart(tmp_path, capsys):
    study = tmp_path / "reused"
    base = ["bench", "--model", "mlp", "--workers", "1", "--steps", "2", "--timeout", "60",
            "--out", str(study)]
    assert main(base + ["--batch-size", "8"]) == 0
    capsys.readouterr()
    assert main(base + ["--batch-size", "16"]) == 0  # another plan, same folder
    out = capsys.readouterr().out
    assert "held a different plan" in out and "kept apart" in out, out
    summary = (study / "summary.txt").read_text()
    assert "batch 8 per device" not in summary and "batch 16 per device" not in summary
    assert "Not in this study's plan" in summary
    page = (study / "report" / "report.html").read_text()
    assert "Not in this study&#x27;s plan" in page
    planned = {r["folder"] for r in json.loads((study / "plan.json").read_text())["runs"]}
    assert len(planned) == 1 and len(list(study.glob("runs/*/record.json"))) == 2

    # growing the plan (a second repeat) resumes: the recorded run is kept
    assert main(base + ["--batch-size", "16", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "the plan grew" in out and "1 of 2 runs already done" in out, out


@pytest.mark.slow
def test_quiet_machine_waits_for_a_busy_machine_and_records_what_it_saw(tmp_path, capsys):
    study = tmp_path / "quiet"
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert main(["bench", "--model", "mlp", "--workers", "1", "--steps", "2",
                     "--timeout", "60", "--quiet-machine", "2", "--out", str(study)]) == 0
    finally:
        spinner.kill()
        spinner.wait()
    out = capsys.readouterr().out
    assert "waiting for a quiet machine" in out and "still busy" in out, out
    [found] = [json.loads(p.read_text()) for p in study.glob("runs/*/record.json")]
    seen = found["study"]["quiet_machine"]
    assert seen["quiet"] is False and seen["max_s"] == 2.0
    assert seen["other_cores"] >= seen["busy_threshold_cores"]
    # the biggest other processes, named (the spinner among them unless the shared machine
    # runs bigger ones)
    assert seen["top_others"] and all({"pid", "command", "cores"} <= set(p)
                                      for p in seen["top_others"])


def test_quiet_machine_rejects_a_negative_wait(tmp_path, capsys):
    assert main(["bench", "--model", "mlp", "--workers", "1", "--quiet-machine", "-1",
                 "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "--quiet-machine" in err and "0 or more" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


# ---- the page --------------------------------------------------------------------------------

# Injected into a test copy only: after layout, how many table containers are wider than the
# page lets them be (cut off, or scrolled sideways).
OVERFLOW_PROBE = """<script>
window.addEventListener('load', function () {
  var boxes = Array.prototype.slice.call(document.querySelectorAll('.wide'));
  var out = document.createElement('pre');
  out.id = 'overflow';
  out.textContent = JSON.stringify({tables: boxes.length, overflowing: boxes.filter(
    function (b) { return b.scrollWidth > b.clientWidth + 1; }).map(
    function (b) { return b.scrollWidth + '>' + b.clientWidth; })});
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.slow
def test_report_tables_fit_the_page_in_chromium(tmp_path):
    import re


    tta = {"target": 0.9, "reached": True, "epoch": 3, "elapsed_s": 14.2}
    records = []
    for scaling in ("weak", "strong"):
        for n, xs in ((1, [1010.0, 1000.0, 990.0]), (2, [1500.0, 1440.0, 1380.0]),
                      (4, [2600.0, 2500.0, 2300.0])):
            extra = {"scaling": scaling, "tta": tta, "global_batch": 128 if scaling == "strong"
                     else None}
            records += repeats(n, xs, machine=machine_block() if n == 4 else None, **extra)
            if n > 1:
                records += repeats(n, [x * 1.1 for x in xs], baseline=True, sync="none", **extra)
    for rec in records:
        rec["study"]["config_id"] += f"-{rec['study']['scaling']}"
    page = write_report([write_study(tmp_path / "study", _with_ids(records))])
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace('<meta charset="utf-8">',
                                               '<meta charset="utf-8">' + OVERFLOW_PROBE, 1))
    result = run_chromium(tmp_path / "profile", "--window-size=1200,3000", "--dump-dom",
                           probed.as_uri())
    found = re.search(r'<pre id="overflow">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stderr[-2000:]
    seen = json.loads(found.group(1).replace("&quot;", '"'))
    assert seen["tables"] >= 3 and seen["overflowing"] == [], seen
