"""Training on one CUDA device: what the CPU tests cannot show (``make test-gpu``).

The device comes from --gpus (runtime.world.resolve_device_type, then torch.cuda.set_device in
join), the backend from it (NCCL), and the record says both; the CUDA allocator's peak goes in
the record's ``memory`` section (training.observe.measure.peak_memory); fp16 trains with a
gradient scaler whose state a checkpoint keeps, bf16 without one (training.loop.step);
``--compile`` wraps the model in torch.compile. Skipped, with the reason, where torch sees no CUDA device.
"""
from __future__ import annotations

import pytest
import torch

from conftest import GPU_TIER, run_training
from parascale.training.checkpoint import disk as checkpoint

pytestmark = GPU_TIER

ONE_GPU = dict(gpus=(0,), model="mlp", dataset="digits", seed=3)


def test_one_gpu_trains_and_its_record_names_the_device_and_nccl(tmp_path):
    record, state = run_training(tmp_path / "run", batch_size=32, epochs=3, **ONE_GPU)
    environment = record["environment"]
    assert environment["device_type"] == "cuda" and environment["backend"] == "nccl"
    assert environment["devices"] == [torch.cuda.get_device_name(0)]
    assert record["config"]["workers"] == 1
    # it learned: the CPU tests reach 95 % with this model and data; 10 % is chance
    assert record["summary"]["final_test_accuracy"] >= 0.85
    assert state is not None  # the model was saved


@pytest.mark.parametrize("sync", ["allreduce", "reduce-broadcast"])
def test_nccl_with_one_rank(tmp_path, sync):
    """An explicit --backend nccl on a world of one: DDP's and our own exchange both run."""
    record, _ = run_training(tmp_path / "run", backend="nccl", sync=sync, steps=6,
                             batch_size=32, **ONE_GPU)
    assert record["environment"]["backend"] == "nccl"
    assert record["derived"]["total_steps"] == 6


def test_the_cuda_peak_memory_is_recorded_and_grows_with_the_batch(tmp_path):
    peaks = {}
    for batch in (16, 512):
        record, _ = run_training(tmp_path / f"b{batch}", batch_size=batch, steps=3,
                                 image_size=64, **{**ONE_GPU, "model": "smallcnn"})
        memory = record["memory"]
        assert memory["kind"] == "cuda_max_allocated"
        (peak,), (reserved,) = memory["peak_bytes_per_rank"], memory["reserved_bytes_per_rank"]
        assert 0 < peak <= reserved <= torch.cuda.get_device_properties(0).total_memory
        peaks[batch] = peak
    # activations grow with the batch; a CPU figure (the process's RSS) would barely move
    assert peaks[512] > peaks[16]


def _newest_trained(out) -> dict:
    newest = sorted((out / checkpoint.FOLDER).glob("step-*.pt"))[-1]
    saved = checkpoint.load(newest)
    return saved["shared"] if saved["replicas_agree"] else saved["ranks"][0]


def test_fp16_trains_with_a_gradient_scaler_that_checkpoints_keep(tmp_path, monkeypatch):
    out = tmp_path / "fp16"
    fp16 = dict(precision="fp16", steps=6, checkpoint_every=3, batch_size=32, **ONE_GPU)
    monkeypatch.setenv("PARASCALE_FAULT", "raise@0:5")  # stopped after the step-3 checkpoint
    run_training(out, expect="failed", **fp16)
    scaler = _newest_trained(out)["scaler"]
    assert scaler is not None and scaler["scale"] > 0  # GradScaler's state, not a placeholder
    monkeypatch.delenv("PARASCALE_FAULT")
    record, _ = run_training(out, resume=True, **fp16)  # restores the scaler and finishes
    assert record["resumed"] and record["config"]["precision"] == "fp16"
    assert all(e["train_loss"] == e["train_loss"] for e in record["epochs"])  # no NaN


def test_bf16_needs_no_scaler(tmp_path):
    out = tmp_path / "bf16"
    record, _ = run_training(out, precision="bf16", steps=6, checkpoint_every=3,
                             batch_size=32, **ONE_GPU)
    assert record["config"]["precision"] == "bf16"
    assert _newest_trained(out)["scaler"] is None
    assert record["summary"]["final_train_loss"] == record["summary"]["final_train_loss"]


def test_compile_trains_as_eager_does(tmp_path):
    """torch.compile on the device (inductor's GPU kernels): the same losses to rounding."""
    eager, _ = run_training(tmp_path / "eager", steps=10, batch_size=32, **ONE_GPU)
    compiled, _ = run_training(tmp_path / "compiled", compile=True, steps=10, batch_size=32,
                               **ONE_GPU)
    assert compiled["config"]["compile"] is True
    assert [e["train_loss"] for e in compiled["epochs"]] == pytest.approx(
        [e["train_loss"] for e in eager["epochs"]], rel=1e-3)
