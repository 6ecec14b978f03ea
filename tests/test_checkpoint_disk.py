"""Checkpoints on a disk that fills up: a real, small file system (a tmpfs) made full.

A checkpoint that does not fit is one line naming "no space left on device" and the folder; the
checkpoints before it stay usable, and a --resume once there is room continues from them."""
from __future__ import annotations

import os

import pytest
import torch

from conftest import fill_disk, one_line_error, run_state, run_training
from parascale.cli.main import main
from parascale.errors import NoSpace
from parascale.training.checkpoint import disk as checkpoint

BIG = {"w": torch.ones(64, 1024)}  # 256 KB
MANIFEST = {"epoch": 2, "world_size": 1, "config": {}}


def test_a_checkpoint_that_does_not_fit_is_one_line_and_the_one_before_stays(small_disk):
    folder = small_disk / "checkpoints"
    checkpoint.save(folder, 3, {**run_state(3), "big": BIG}, MANIFEST)
    fill_disk(small_disk, leave=64 << 10)
    with pytest.raises(NoSpace) as refused:
        checkpoint.save(folder, 6, {**run_state(6), "big": BIG}, MANIFEST)
    message = str(refused.value)
    assert "\n" not in message and "inline_container" not in message
    assert message.startswith("no space left on device: cannot write "
                              f"{folder}/step-00000006.pt")
    assert "continue the run with --resume" in message
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000003.json", "step-00000003.pt"]
    found, damaged = checkpoint.newest(folder, print)
    assert found.step == 3 and not damaged
    assert torch.equal(checkpoint.load(found)["big"]["w"], BIG["w"])


def test_a_checkpoint_whose_manifest_does_not_fit_leaves_no_file(small_disk):
    folder = small_disk / "checkpoints"
    first = checkpoint.save(folder, 3, {**run_state(3), "big": BIG}, MANIFEST)
    pages = -(-first.path.stat().st_size // 4096) * 4096
    fill_disk(small_disk, leave=pages)  # room for the .pt, none for its manifest
    with pytest.raises(NoSpace):
        checkpoint.save(folder, 6, {**run_state(6), "big": BIG}, MANIFEST)
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000003.json", "step-00000003.pt"]


# A run stopped by a fault after its checkpoint at step 2 resumes on a disk without room for the
# one at step 4, then once there is room again. "pt": 2 workers write one .pt (1.2 MB). "fsdp":
# DCP writes the parts, and torch.save inside it raises a full disk as its own RuntimeError,
# whose OSError DCP drops when it hands the failure between ranks; one worker, so that DCP still
# hands it on (the process group is there) and no other rank's write races this one's for the
# room left.
RUNS = {"pt": (dict(workers=2, model="smallcnn", global_batch=256, lr=0.1), "raise@1:4", ".pt"),
        "fsdp": (dict(workers=1, model="mlp", global_batch=64, sync="fsdp"), "raise@0:4", "")}


@pytest.mark.slow
@pytest.mark.parametrize("case", RUNS)
def test_a_run_whose_checkpoint_does_not_fit_stops_in_one_line_and_resumes(small_disk, capfd,
                                                                           monkeypatch, case):
    out = small_disk / "run"
    given, fault, kind = RUNS[case]
    options = dict(**given, dataset="digits", seed=3, checkpoint_every=2, keep=1, steps=4)
    monkeypatch.setenv("PARASCALE_FAULT", fault)  # stopped after its checkpoint at step 2
    run_training(out, expect="failed", **options)
    monkeypatch.delenv("PARASCALE_FAULT")
    results = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    filler = fill_disk(small_disk, leave=64 << 10)  # no room for the next one
    capfd.readouterr()

    code = main(["train", *(a for k, v in options.items() for a in (f"--{k.replace('_', '-')}",
                                                                     str(v))),
                 "--timeout", "60", "--resume", "--out", str(out)])
    line = one_line_error(capfd)  # the workers' output too: no traceback there either
    assert code == 2 and "no space left on device" in line, line
    assert f"cannot write {out}/checkpoints/step-00000004{kind}," in line, line
    assert "continue the run with --resume" in line and "inline_container" not in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == results
    assert set(os.listdir(out / "checkpoints")) == {"log.txt", f"step-00000002{kind}",
                                                    "step-00000002.json"}

    filler.unlink()  # room again: the run continues from the checkpoint that was kept
    record, _ = run_training(out, resume=True, **options)
    assert [(r["checkpoint"], r["step"]) for r in record["resumed"]] == \
        [(f"checkpoints/step-00000002{kind or '/'}", 2)]
