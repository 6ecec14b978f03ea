"""Time-to-accuracy read from every run's curve (report --target), and Crossbow's three plots."""
from __future__ import annotations

import json

import pytest
from conftest import record, write_study

from parascale.cli.main import main
from parascale.report import crossbow, load_studies, terminal_summary
from parascale.report.accuracy import time_to_target
from parascale.report.plots import COLORS, new_figure


def curve(*points):
    return [{"epoch": i, "elapsed_s": t, "test_accuracy": a} for i, (t, a) in enumerate(points, 1)]


def test_time_to_target_is_the_first_evaluation_reaching_it():
    reached = time_to_target(curve((1.0, 0.5), (2.0, 0.92), (3.0, 0.88), (4.0, 0.95)), 0.9)
    assert (reached["reached"], reached["epoch"], reached["elapsed_s"]) == (True, 2, 2.0)
    first = time_to_target(curve((1.0, 0.91)), 0.9)
    assert (first["epoch"], first["elapsed_s"]) == (1, 1.0)
    missed = time_to_target(curve((1.0, 0.5), (2.0, 0.89)), 0.9)
    assert (missed["reached"], missed["elapsed_s"], missed["best"]) == (False, None, 0.89)
    unevaluated = time_to_target([{"epoch": 1, "elapsed_s": 1.0, "test_accuracy": None}], 0.9)
    assert (unevaluated["reached"], unevaluated["evaluated"], unevaluated["best"]) == \
        (False, 0, None)


def sma(workers, learners, throughput, *, batch=16, repeat=0, tuning=None, accuracy=0.95):
    rec = record(workers, throughput, sync="sma", batch=batch * learners, repeat=repeat,
                 accuracy=accuracy, scaling=None)
    rec["config"].update(batch_size=batch, learners="auto" if tuning else learners,
                         tune_threshold=0.1)
    rec["derived"]["sync_options"] = {"learners": learners, "sma_alpha": 0.1,
                                      "sma_momentum": 0.9, "period": 1}
    rec["sync"] = {"learners": learners, "syncs": 40, "resets": 0, "central_spread": 0.0,
                   "distance": [], "distance_every": 1, "tuning": tuning or []}
    rec["study"]["config_id"] = f"sma-b{batch}-m{'auto' if tuning else learners}-r{repeat}"
    return rec


TUNING = [{"learners": 1, "throughput": 100.0, "gain": None, "decision": "add", "elapsed_s": 1},
          {"learners": 2, "throughput": 130.0, "gain": 0.3, "decision": "add", "elapsed_s": 2},
          {"learners": 3, "throughput": 135.0, "gain": 0.04, "decision": "remove",
           "elapsed_s": 3}]


def study(tmp_path):
    runs = [sma(2, m, 1000.0 * (1 + 0.2 * m), batch=b, accuracy=0.95 - 0.02 * m)
            for m in (1, 2, 4) for b in (8, 16)]
    runs.append(sma(2, 2, 1300.0, tuning=TUNING))
    return write_study(tmp_path / "study", runs)


def test_report_target_times_every_run_and_says_not_reached(tmp_path):
    folder = study(tmp_path)
    loaded = load_studies([folder], 0.9)
    out = terminal_summary(loaded)
    assert "time to 90%" in out and "not reached" in out  # 4 learners end at 87%
    times = {r.data["study"]["config_id"]: r.data["time_to_accuracy"] for r in loaded.ok}
    assert times["sma-b8-m1-r0"]["reached"] and times["sma-b8-m1-r0"]["epoch"] == 3  # 93%
    assert times["sma-b8-m4-r0"] == {**times["sma-b8-m4-r0"], "reached": False,
                                     "elapsed_s": None}
    on_disk = json.loads((folder / "runs" / "sma-b8-m1-r0" / "record.json").read_text())
    assert on_disk["time_to_accuracy"] is None  # computed for the report, never written back


@pytest.mark.parametrize("value", ["0", "1.5", "x", "nan"])
def test_a_bad_target_is_one_line_and_writes_nothing(tmp_path, capsys, value):
    folder = study(tmp_path)
    assert main(["report", str(folder), "--target", value, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--target" in err[0], err
    assert not (tmp_path / "r").exists()


def test_a_study_target_fills_records_that_lack_the_computation(tmp_path):
    rec = record(2, 1000.0, accuracy=0.95)
    rec["config"]["target_accuracy"] = 0.9
    loaded = load_studies([write_study(tmp_path / "s", [rec])])
    assert loaded.ok[0].data["time_to_accuracy"]["reached"] is True


def drawn(records) -> set[str]:
    """The names of the Crossbow figures built (not rendered: that is make_plots' part)."""
    made = [build(records, new_figure, COLORS) for build in crossbow.BUILDERS]
    return {m[1] for m in made if m is not None}


def test_crossbow_plots_are_drawn_for_sma_runs_and_only_then(tmp_path):
    assert drawn(load_studies([study(tmp_path)], 0.9).ok) == {
        "crossbow_tta_by_batch", "crossbow_learner_gain", "crossbow_accuracy_by_learners"}
    plain = [record(n, 1000.0 * n, accuracy=0.95, batch=b) for n in (1, 2) for b in (16, 32)]
    for i, rec in enumerate(plain):
        rec["study"]["config_id"] = f"plain{i}"
    # batch sizes and a target: the time-to-accuracy figure, but nothing about learners
    assert drawn(load_studies([write_study(tmp_path / "plain", plain)], 0.9).ok) == {
        "crossbow_tta_by_batch"}
    assert drawn(load_studies([write_study(tmp_path / "plain", plain)]).ok) == set()


def demo_like() -> list[dict]:
    """The demo's runs: weak scaling at 24 a device and strong at a global 64, on 1 and 2
    workers, and the 2-worker contention baselines; each reached its target."""
    runs = []
    for scaling, batches in (("weak", {1: 24, 2: 24}), ("strong", {1: 64, 2: 32})):
        for n, b in batches.items():
            for sync in ("allreduce", "baseline") if n > 1 else ("allreduce",):
                rec = record(n, 1000.0 * n, accuracy=0.95, batch=b, scaling=scaling, sync=sync,
                             baseline=sync == "baseline")
                rec["study"]["config_id"] = f"{scaling}-n{n}-{sync}"
                runs.append(rec)
    return runs


def tta_figure(tmp_path, runs):
    loaded = load_studies([write_study(tmp_path / "s", runs)], 0.9).ok
    fig, name, title, caption = crossbow.tta_by_batch(loaded, new_figure, COLORS)
    (ax,) = fig.axes
    return ax, title, caption


def test_time_to_accuracy_by_batch_joins_only_runs_alike_but_for_their_batch(tmp_path):
    """The demo's runs differ in mode and worker count, not only in batch: each is a point of
    its own series, never one line read as a batch-size trend; titled, and naming no learners
    where no run has them."""
    ax, title, caption = tta_figure(tmp_path, demo_like())
    drawn = {line.get_label(): len(line.get_xdata()) for line in ax.get_lines()}
    assert drawn == {"allreduce, weak, 1 worker(s)": 1, "allreduce, weak, 2 worker(s)": 1,
                     "baseline, weak, 2 worker(s)": 1, "allreduce, strong, 1 worker(s)": 1,
                     "allreduce, strong, 2 worker(s)": 1, "baseline, strong, 2 worker(s)": 1}
    assert ax.get_title() == title
    assert "learner" not in ax.get_xlabel() and "sma" not in ax.get_xlabel()
    assert "learner" not in caption
    # a strategy of learners run at several batches, all else alike: one line through them
    ax, _, _ = tta_figure(tmp_path / "sma", [sma(2, 2, 1400.0, batch=b, accuracy=0.95)
                                               for b in (8, 16)])
    assert {line.get_label(): len(line.get_xdata()) for line in ax.get_lines()} == {
        "sma, 2 learner(s), 2 worker(s)": 2}
    assert "learner" in ax.get_xlabel()
