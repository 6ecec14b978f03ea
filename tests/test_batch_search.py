"""The batch search: exact answers and probe counts on simulated memory curves, and a real CPU
search under a small budget, each probe a process of its own."""
from __future__ import annotations

import json

import pytest

from parascale.batchfind import Probe, search
from parascale.cli.main import main


def curve(base: int, per_sample: int, budget: int | None, ceiling: int | None = None):
    """A device whose probe of batch b peaks at base + per_sample * b; over ``budget`` (a CPU)
    or over ``ceiling`` (a GPU's out-of-memory error) it does not fit."""
    ran = []

    def try_batch(b: int) -> Probe:
        ran.append(b)
        peak = base + per_sample * b
        fits = (budget is None or peak <= budget) and (ceiling is None or peak <= ceiling)
        return Probe(b, fits, peak, "" if fits else "out of memory")

    return try_batch, ran


def test_a_gpu_search_doubles_then_bisects_to_the_exact_largest_batch():
    try_batch, ran = curve(100, 10, None, ceiling=470)  # fits up to 37
    found = search(try_batch, None)
    assert found.best.batch == 37
    assert ran == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]


def test_a_cpu_search_never_starts_a_probe_predicted_over_the_budget():
    try_batch, ran = curve(100, 10, 1000)  # fits up to 90
    found = search(try_batch, 1000)
    assert found.best.batch == 90
    assert ran == [1, 2, 4, 8, 16, 32, 64, 80, 88, 90]  # 10 probes run
    skipped = [p.batch for p in found.probes if not p.ran]
    assert skipped == [128, 96, 92, 91]  # each predicted over 1000 from the line through two


def test_the_search_stops_at_the_limit_when_everything_fits():
    try_batch, ran = curve(100, 1, None, ceiling=10**9)
    found = search(try_batch, None, limit=100)
    assert found.best.batch == 100 and ran == [1, 2, 4, 8, 16, 32, 64, 100]


def test_nothing_fits():
    try_batch, _ = curve(100, 1, 50)
    assert search(try_batch, 50).best is None


@pytest.mark.slow
def test_a_real_cpu_search_under_a_small_budget(tmp_path, capsys):
    # the probe's own start (torch imported in the fork server) is most of the first probe's
    # peak; a budget 64 MiB above it lets resnet20 on synthetic images grow to a few dozen (a
    # larger budget tries larger batches, each seconds of CPU, to show the same bisection)
    out = tmp_path / "found.json"
    assert main(["find-batch", "--model", "smallcnn", "--dataset", "synthetic",
                 "--memory-limit", "10G", "--max-batch", "2", "--out", str(out)]) == 0
    first = json.loads(out.read_text())["probes"][0]["peak_bytes"]
    budget = first + (64 << 20)
    assert main(["find-batch", "--model", "resnet20", "--dataset", "synthetic",
                 "--memory-limit", f"{budget / (1 << 20):.0f}M", "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    best = found["batch"]
    assert 2 <= best < found["limit"] and found["peak_bytes"] <= found["budget_bytes"]
    tried = {p["batch"]: p for p in found["probes"]}
    assert not tried[best + 1]["fits"]  # the bisection ended between neighbours
    assert [t["global_batch"] for t in found["table"]] == [best, 2 * best, 4 * best, 8 * best]
    printed = capsys.readouterr().out
    assert f"largest per-device batch: {best}" in printed


def test_bad_input_is_one_line(capsys):
    assert main(["find-batch", "--model", "nope"]) == 2
    assert main(["find-batch", "--model", "mlp", "--memory-limit", "lots"]) == 2
    assert main(["find-batch", "--model", "mlp", "--gpus", "0", "--memory-limit", "1G"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("parascale: error: ") for line in err), err


@pytest.mark.slow
def test_bench_batch_size_max_runs_with_the_batch_the_search_found(tmp_path, capsys):
    assert main(["bench", "--model", "mlp", "--dataset", "digits", "--batch-size", "max",
                 "--scaling", "weak", "--workers", "1,2", "--epochs", "1",
                 "--out", str(tmp_path / "study")]) == 0
    out = capsys.readouterr().out
    found = int(out.split("batch_size max for mlp: ")[1].split()[0])
    from parascale.runtime.env import available_cores

    # an MLP on 8x8 digits fits up to the data's share of one worker per core
    assert found == 1437 // available_cores()
    records = [json.loads(p.read_text()) for p in (tmp_path / "study").glob("runs/*/record.json")]
    assert sorted(r["derived"]["global_batch"] for r in records) == [found, 2 * found]
