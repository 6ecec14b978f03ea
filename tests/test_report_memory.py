"""The report's memory per device against N: each rank's peak and rank 0's split by category,
per strategy when a study varies --sync (a table column, CSV columns and the memory plot)."""
from __future__ import annotations

import csv
import io

import torch
from torch import nn

from conftest import record, write_study
from parascale.report import load_records, summary_rows
from parascale.report.plots import _memory, make_plots, series_labels
from parascale.report.rows import grouped
from parascale.report.tables import format_csv, format_markdown
from parascale.training.observe.memory_split import MemorySplit

MIB = 1 << 20


def measured_split(peak: int) -> dict:
    """One rank's memory.split_per_rank entry, measured as the trainer measures it."""
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    split = MemorySplit()
    with split.forward():
        model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
    split.after_step(model, optimizer)
    return split.section(peak)


def scaled(split: dict, **factors: float) -> dict:
    """A split with some categories divided, as a shard of them (``gradients_bytes=2``)."""
    return {k: int(v / factors.get(k, 1)) if isinstance(v, int) else v for k, v in split.items()}


def study(tmp_path, with_split: bool = True):
    base = measured_split(300 * MIB)
    held = {"allreduce": {}, "zero": {"optimizer_state_bytes": 2},
            "fsdp": {k: 2 for k in ("parameters_bytes", "gradients_bytes",
                                    "optimizer_state_bytes")}}
    peaks = {"allreduce": (300, 310), "zero": (280, 290), "fsdp": (250, 255)}
    records = []
    for sync, (lo, hi) in peaks.items():
        for n in (1, 2):
            rec = record(n, 1000.0 * n, sync=sync)
            # on one worker nothing is sharded: every strategy holds the whole
            split = scaled(base, **(held[sync] if n == 2 else {}))
            rec["memory"] = {"kind": "cpu_max_rss",
                             "peak_bytes_per_rank": [lo * MIB, hi * MIB][:n]}
            if with_split:
                rec["memory"]["split_per_rank"] = [split] * n
            records.append(rec)
    return summary_rows(load_records([write_study(tmp_path / "s", records)]).records), base


def test_rows_carry_every_ranks_peak_and_rank_0s_split(tmp_path):
    rows, base = study(tmp_path)
    by = {(r.key.sync, r.workers): r for r in rows}
    assert by["zero", 2].peak_per_rank == (280 * MIB, 290 * MIB)
    assert by["zero", 2].peak_memory_bytes == 290 * MIB  # the largest rank's, as before
    assert by["zero", 2].memory_split["optimizer_state_bytes"] == \
        base["optimizer_state_bytes"] // 2
    assert by["fsdp", 2].memory_split["parameters_bytes"] == base["parameters_bytes"] // 2
    assert by["allreduce", 2].memory_split == by["allreduce", 1].memory_split


def test_the_table_and_csv_show_what_each_strategy_held(tmp_path):
    rows, base = study(tmp_path)
    text = format_markdown(rows)
    assert "held (MiB)" in text
    fsdp = next(r for r in rows if r.key.sync == "fsdp" and r.workers == 2)
    parts = [fsdp.memory_split[k] / MIB for k in ("parameters_bytes", "gradients_bytes",
                                                    "optimizer_state_bytes", "activations_bytes")]
    assert f"{sum(parts):.3g} (" + " + ".join(f"{v:.3g}" for v in parts) + ")" in text
    table = list(csv.DictReader(io.StringIO(format_csv(rows))))
    row = next(t for t in table if t["sync"] == "fsdp" and t["workers"] == "2")
    assert float(row["gradients_bytes"]) == base["gradients_bytes"] // 2
    assert float(row["peak_memory_min_bytes"]) == 250 * MIB


def test_the_memory_plot_has_a_line_per_strategy_and_the_split_below(tmp_path):
    rows, _ = study(tmp_path)
    assert "memory" in {p.name for p in make_plots(rows)}
    groups = grouped(rows)
    labels = series_labels(list(groups))
    colors = {k: f"C{i}" for i, k in enumerate(groups)}
    fig, name, _, caption = _memory(groups, labels, colors)
    top, bottom = fig.axes[:2]
    lines = {line.get_label(): list(line.get_ydata()) for line in top.get_lines()}
    assert lines["smallcnn sync fsdp: largest rank"] == [250, 255]  # MiB at N = 1, 2
    assert lines["smallcnn sync allreduce: largest rank"] == [300, 310]
    # four categories stacked for each of 3 strategies at 2 worker counts
    assert len(bottom.patches) == 4 * 3 * 2 + 4  # and the legend's four swatches
    assert "Bottom" in caption


def test_without_a_split_the_plot_shows_the_peaks_alone(tmp_path):
    rows, _ = study(tmp_path, with_split=False)
    groups = grouped(rows)
    fig, *_ = _memory(groups, series_labels(list(groups)), {k: "C0" for k in groups})
    assert len(fig.axes) == 1
    assert "held (MiB)" not in format_markdown(rows)
