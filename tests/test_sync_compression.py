"""fp16 compression outside DDP: reduce-broadcast and the parameter server send half the bytes
and train within fp16's rounding of the uncompressed run (2 real gloo workers, a few steps)."""
import subprocess
import sys

import pytest
import torch

from conftest import run_training

STEPS = dict(workers=2, global_batch=32, steps=4, lr=0.1, momentum=0.9, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["reduce-broadcast", "parameter-server"])
def test_fp16_halves_the_bytes_and_stays_within_its_rounding(tmp_path, strategy):
    plain, exact = run_training(tmp_path / "none", sync=strategy, **STEPS)
    half, rounded = run_training(tmp_path / "fp16", sync=strategy, compression="fp16", **STEPS)
    assert half["derived"]["bytes_per_step"] * 2 == plain["derived"]["bytes_per_step"] > 0
    assert half["derived"]["sync_options"]["compression"] == "fp16"
    difference = max(float((exact[k] - rounded[k]).abs().max()) for k in exact)
    # fp16 keeps ~3 significant digits of gradients of order 0.1 over 4 steps at lr 0.1;
    # 0 would mean nothing was rounded, i.e. the gradients did not travel compressed
    assert 0 < difference < 2e-3, difference


def test_a_cast_compressor_rounds_to_its_type_and_counts_its_bytes():
    from parascale.sync import compression

    grad = torch.tensor([1 / 3, 70000.0, -2.5])
    half = compression.make("fp16")
    wire = half.compress(grad)
    assert wire.dtype == torch.float16 and half.bytes_for(3, 4) == 6
    out = half.decompress(wire, torch.empty(3))
    assert out[0] != grad[0] and abs(out[0] - grad[0]) < 1e-3 and out[2] == -2.5
    assert torch.isinf(out[1])  # above fp16's 65504: why bf16 exists
    plain = compression.make("none")
    assert plain.compress(grad) is grad and plain.bytes_for(3, 4) == 12


@pytest.mark.slow  # the command line as a user runs it: a subprocess
def test_powersgd_outside_ddp_is_one_line_exit_2_and_nothing_written(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "parascale", "train", "--workers", "2",
                           "--sync", "reduce-broadcast", "--compression", "powersgd",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == ("parascale: error: --compression powersgd works with --sync allreduce "
                           "only (it needs an all-reduce between its halves), not --sync "
                           "reduce-broadcast; use fp16 or bf16\n")
    assert not (tmp_path / "run").exists()
