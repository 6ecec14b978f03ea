"""Report plots: written, non-empty, valid PNG and SVG, for one model and for several overlaid."""
from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure

from parascale.report import load_records, summary_rows
from parascale.report.plots import worker_axis, make_plots, series_labels, write_plots
from conftest import record, write_study
from helpers import record_at

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SCALING_PLOTS = {"epoch_time", "throughput", "speedup", "efficiency", "accuracy", "step_time",
                 "memory"}


def _check_files(out: Path, names: set[str]) -> None:
    for name in names:
        png, svg = out / f"{name}.png", out / f"{name}.svg"
        assert png.read_bytes()[:8] == PNG_MAGIC, png
        assert png.stat().st_size > 5000, png  # a real chart, not an empty canvas
        head = svg.read_text()[:500]
        assert head.startswith("<?xml") and "<svg" in head, svg
        assert svg.stat().st_size > 5000, svg


@pytest.fixture(scope="module")
def one_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one")
    recs = [record(n, 1000.0 * n * e) for n, e in ((1, 1.0), (2, 0.9), (4, 0.8))]
    return folder, summary_rows(load_records([write_study(folder / "study", recs)]).records)


def test_one_model_writes_every_scaling_plot(one_model):
    folder, rows = one_model
    plots = make_plots(rows)
    assert {p.name for p in plots} == SCALING_PLOTS  # no comparison chart for a single series
    written = write_plots(plots, folder / "out")
    assert len(written) == 2 * len(plots)
    _check_files(folder / "out", SCALING_PLOTS)
    assert not list((folder / "out").glob(".*tmp"))


def test_two_models_and_two_studies_overlaid(tmp_path):
    small = [record(n, 1000.0 * n * e) for n, e in ((1, 1.0), (2, 0.86), (4, 0.7))]
    big = [record(n, 100.0 * n * e, model="resnet152") for n, e in ((1, 1.0), (2, 0.95), (4, 0.9))]
    other = [record(n, 900.0 * n * e) for n, e in ((1, 1.0), (2, 0.8))]
    a = write_study(tmp_path / "a", small + big)
    b = write_study(tmp_path / "b", other)
    rows = summary_rows(load_records([a, b]).records)
    plots = make_plots(rows)
    assert {p.name for p in plots} == SCALING_PLOTS | {"comparison"}
    write_plots(plots, tmp_path / "out")
    _check_files(tmp_path / "out", SCALING_PLOTS | {"comparison"})
    # three series, each named by what tells it apart
    keys = list(dict.fromkeys(r.key for r in rows))
    assert sorted(series_labels(keys).values()) == ["resnet152 [a]", "smallcnn [a]", "smallcnn [b]"]


def test_dollar_signs_in_names_are_not_mathtext(tmp_path):
    name = r"pkg.mod:net$\nosuchcommand$"  # as mathtext this would fail to parse
    recs = [record(n, 100.0 * n, model=name) for n in (1, 2)]
    rows = summary_rows(load_records([write_study(tmp_path / "s", recs)]).records)
    assert series_labels([rows[0].key]) == {rows[0].key: name.replace("$", r"\$")}
    assert {p.name for p in make_plots(rows)} >= {"throughput", "speedup"}


def test_plots_without_step_times_or_accuracy_are_left_out(tmp_path):
    recs = [record(n, 100.0 * n) for n in (1, 2)]
    for rec in recs:
        rec["steps"] = None
        for epoch in rec["epochs"]:
            epoch["test_accuracy"] = None
    rows = summary_rows(load_records([write_study(tmp_path / "s", recs)]).records)
    assert {p.name for p in make_plots(rows)} == {"epoch_time", "throughput", "speedup", "efficiency",
                                                  "memory"}
    assert make_plots([]) == []


@pytest.mark.parametrize("ns, log2", [([1, 2, 4, 8], True), ([2, 8, 16], True),
                                      ([1, 3, 6], False), ([4], False)])
def test_worker_axis_is_log2_for_powers_of_two_with_real_labels(ns, log2):
    ax = Figure().subplots()
    worker_axis(ax, ns)
    assert (ax.get_xscale() == "log") == log2
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(n) for n in ns]
    assert list(ax.get_xticks()) == ns


def test_plot_labels_are_short_whatever_the_model_name(tmp_path):
    rows = summary_rows(load_records([write_study(tmp_path / "s", [
        record_at("a", 1, 100.0, model="pkg." + "m" * 9_000 + ":build"),
        record_at("b", 2, 190.0, model="pkg." + "m" * 9_000 + ":build")])]).records)
    [label] = series_labels([rows[0].key]).values()
    assert len(label) <= 80 and label.startswith("pkg.mmm") and label.endswith(":build")
