"""fp16 compression outside DDP: reduce-broadcast and the parameter server send half the bytes
and train within fp16's rounding of the uncompressed run (2 real gloo workers, a few steps)."""
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
