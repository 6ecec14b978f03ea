"""CUDA's out-of-memory error as a result, not a crash (``make test-gpu``).

find-batch on a GPU doubles the batch until a probe raises torch.OutOfMemoryError in its own
process (batchfind.probe), then bisects; a study records a run that ran out of CUDA memory as
status ``oom`` (runtime.failure.is_out_of_memory) and skips the larger batches of the same
configuration (bench.runner). ResNet-56 at 512x512 or more needs gigabytes per sample, so even
a large GPU runs out within a few doublings. Skipped, with the reason, without CUDA.
"""
from __future__ import annotations

import json

import torch

from conftest import GPU_TIER
from parascale.cli.main import main

pytestmark = GPU_TIER

# about 6 GB of activations per sample at 1024x1024 (1.6 GB at 512x512): out of memory within
# a few doublings on any GPU of today, while no tensor reaches 2**31 elements (where some
# kernels fail in other ways); the data set (synthetic, 2048 samples of 3x32x32, resized per
# batch) stays small
HUGE = ["--model", "resnet56", "--dataset", "synthetic", "--image-size", "1024"]


def test_find_batch_ends_at_cuda_out_of_memory(tmp_path, capsys):
    out = tmp_path / "found.json"
    assert main(["find-batch", *HUGE, "--gpus", "0", "--devices", "1,2", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    found = json.loads(out.read_text())
    assert found["device"] == "cuda:0" and found["budget_bytes"] is None
    fitted = [p for p in found["probes"] if p["fits"]]
    failed = [p for p in found["probes"] if not p["fits"]]
    assert failed and all(p["reason"].startswith("out of memory") for p in failed), failed
    best = max(p["batch"] for p in fitted)
    assert found["batch"] == best < min(p["batch"] for p in failed)
    assert best < found["limit"]  # stopped by memory, not by the data set
    # the peak is CUDA's allocator's, and grows with the batch
    peaks = [p["peak_bytes"] for p in sorted(fitted, key=lambda p: p["batch"])]
    assert 0 < peaks[0] and peaks == sorted(peaks)
    assert max(peaks) <= torch.cuda.get_device_properties(0).total_memory
    assert f"largest per-device batch: {best}" in said and "does not fit" in said


def test_a_study_records_cuda_out_of_memory_and_skips_larger_batches(tmp_path, capsys):
    study = tmp_path / "study"
    code = main(["bench", "--model", "resnet56", "--dataset", "synthetic", "--image-size", "512",
                 "--gpus", "0", "-V", "batch_size=2,256,512", "--steps", "2",
                 "--out", str(study)])
    assert code == 0, capsys.readouterr()  # out of memory is a result, not a failed run
    records = {}
    for path in (study / "runs").glob("*/record.json"):
        record = json.loads(path.read_text())
        records[record["config"]["batch_size"]] = record
    assert records[2]["status"] == "ok"
    assert records[2]["memory"]["kind"] == "cuda_max_allocated"
    assert records[256]["status"] == "oom", records[256]["reason"]
    assert "out of memory" in records[256]["reason"].lower()
    skipped = records[512]
    assert skipped["status"] == "skipped"
    assert "larger than 256, which ran out of memory" in skipped["reason"]
