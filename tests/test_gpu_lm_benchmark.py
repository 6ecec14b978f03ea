"""benchmarks/gpu_lm.py, the GPU benchmark of parascale against a plain loop, runs here too: at
a tiny size on the CPU, for a few steps, it prints its table."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "gpu_lm.py"


@pytest.mark.slow  # two parascale runs and two plain ones, each a process
def test_the_gpu_benchmark_runs_tiny_on_the_cpu_and_prints_its_table():
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--steps",
                          "4", "--rounds", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for r in (1, 2):  # each round's figures as it ends
        assert any(line.startswith(f"tiny eager round {r}: plain ") for line in lines), lines
    head = next(i for i, line in enumerate(lines) if line.startswith("shape "))
    assert lines[head].split() == ["shape", "mode", "plain", "ms/step", "parascale", "ms/step",
                                   "plain", "tok/s", "parascale", "tok/s", "plain", "MFU",
                                   "parascale", "MFU", "ratio"]
    row = lines[head + 1]
    assert row.startswith("tiny (2x2x32, T 16, B 4)  eager ")
    figures = row.split("eager")[1].split()
    assert len(figures) == 7
    times_rates_ratio, mfus = figures[:4] + figures[6:], figures[4:6]
    assert all(float(f.replace(",", "")) > 0 for f in times_rates_ratio)
    assert all(f.endswith("%") and float(f[:-1]) >= 0 for f in mfus)  # a tiny model's: ~0%
    assert re.search(r"median of 2 alternating rounds", out.stdout)
