"""``parascale comm``: size parsing and bandwidth factors, and one real run end to end."""
import json
import math
import subprocess
import sys

import pytest

from parascale.cli.main import main
from parascale.comm import bus_factor, format_size, parse_size
from parascale.errors import UsageError


def test_sizes_read_as_powers_of_1024():
    assert [parse_size(s) for s in ("512", "1K", "64M", "1G", "2KiB", "4kb")] == \
        [512, 1024, 64 * 2 ** 20, 2 ** 30, 2048, 4096]
    assert [format_size(s) for s in (512, 1024, 64 * 2 ** 20)] == ["512B", "1K", "64M"]


@pytest.mark.parametrize("bad", ["", "1X", "-4", "2", "1.5"])
def test_unreadable_or_too_small_sizes_are_usage_errors(bad):
    with pytest.raises(UsageError, match="--sizes"):
        parse_size(bad)


def test_bus_factors_are_nccl_tests():
    assert bus_factor("allreduce", 4) == 1.5
    assert bus_factor("all_gather", 4) == 0.75
    assert bus_factor("broadcast", 4) == bus_factor("reduce", 4) == 1.0


def parascale(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "parascale", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_comm_on_two_workers_prints_a_table_and_writes_its_record(tmp_path, capfd):
    # in this process, whose fork server is warm; what it and rank 0 print, at the descriptors
    code = main(["comm", "--workers", "2", "--sizes", "1K,64K", "--out", str(tmp_path)])
    said = capfd.readouterr()
    assert code == 0, said.err
    record = json.loads((tmp_path / "comm.json").read_text())
    assert record["schema"] == "parascale.comm/1" and record["world_size"] == 2
    assert record["environment"]["backend"] == "gloo"
    results = record["results"]
    assert [(r["op"], r["bytes"]) for r in results] == [
        (op, size) for op in ("allreduce", "broadcast", "reduce", "all_gather")
        for size in (1024, 65536)]
    for r in results:
        # a time, not a speed claim: no upper bound that a loaded machine could break
        assert 0 < r["time_s"] < math.inf and r["time_s"] == max(r["time_s_per_rank"])
        assert 0 < r["mean_s"] < math.inf and r["mean_s"] == max(r["mean_s_per_rank"])
        assert r["algbw_bytes_per_s"] == pytest.approx(r["bytes"] / r["time_s"])
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] *
                                                       bus_factor(r["op"], 2))
        assert r["iterations"] >= 5
    lines = said.out.strip().splitlines()
    assert lines[0].split()[:6] == ["op", "size", "iters", "time", "algbw", "GB/s"]
    assert len(lines) == 1 + len(results) + 1 and lines[-1].startswith("record: ")
    assert lines[1].split()[:2] == ["allreduce", "1K"]


@pytest.mark.parametrize("args, message", [
    (["--workers", "1"], "needs at least 2 workers"),
    (["--workers", "2", "--sizes", "1Q"], "--sizes: cannot read '1Q'"),
    (["--workers", "2", "--ops", "allreduce,scatter"], "--ops: unknown 'scatter'"),
])
@pytest.mark.slow
def test_comm_usage_errors_are_one_line_and_exit_2(args, message):
    proc = parascale("comm", *args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
