"""Checkpoint files in one process: what is written, what verifies, what is kept, what loads.

The multi-process tests (a run stopped and resumed, bit for bit) are in
test_checkpoint_resume.py."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from conftest import run_state
from parascale.training.checkpoint import disk as checkpoint
from parascale.training.checkpoint.state import rng_states, set_rng_states


def write(folder, *steps: int) -> list[checkpoint.Found]:
    return [checkpoint.save(folder, s, run_state(s, value=float(s)),
                            {"epoch": 2, "world_size": 1, "config": {"lr": 0.1}})
            for s in steps]


def test_a_checkpoint_round_trips_through_torch_formats(tmp_path):
    folder = tmp_path / "checkpoints"
    found = write(folder, 6)[0]
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000006.json", "step-00000006.pt"]
    manifest = json.loads(found.manifest_path.read_text())
    assert manifest["format"] == checkpoint.FORMAT and manifest["step"] == 6
    assert manifest["bytes"] == found.path.stat().st_size and len(manifest["sha256"]) == 64
    assert manifest["config"] == {"lr": 0.1}  # the caller's facts are kept
    assert checkpoint.verify(checkpoint.listing(folder)[0]).problem is None
    loaded = checkpoint.load(found)
    torch.testing.assert_close(loaded["shared"]["model"]["w"], torch.full((64, 64), 6.0))
    assert loaded["progress"] == run_state()["progress"]
    # plain torch reads it, with weights_only: nothing but data comes out of the file
    assert torch.equal(torch.load(found.path, weights_only=True)["shared"]["model"]["b"],
                       torch.arange(8.0))


def test_every_rng_state_survives_the_file(tmp_path):
    generator = torch.Generator().manual_seed(11)
    torch.rand(3, generator=generator)  # moved on from its seed, as mid-epoch
    saved = rng_states(torch.device("cpu"), generator)
    found = checkpoint.save(tmp_path, 1, {"rng": saved}, {})
    expected = (torch.rand(4), np.random.rand(4), random.random(),
                torch.rand(4, generator=generator))
    loaded = checkpoint.load(found)["rng"]
    set_rng_states(loaded, torch.device("cpu"))
    again = torch.Generator()
    again.set_state(loaded["epoch"])
    assert torch.equal(torch.rand(4), expected[0])
    assert np.array_equal(np.random.rand(4), expected[1])
    assert random.random() == expected[2]
    assert torch.equal(torch.rand(4, generator=again), expected[3])


@pytest.mark.parametrize("damage, words", [
    (lambda pt, js: pt.write_bytes(pt.read_bytes()[:1000]), "bytes where its manifest says"),
    (lambda pt, js: pt.write_bytes(_flip(pt.read_bytes())), "SHA-256 checksum does not match"),
    (lambda pt, js: js.unlink(), "has no manifest"),
    (lambda pt, js: js.write_text("{not json"), "manifest is unreadable"),
])
def test_a_damaged_checkpoint_is_named_and_the_one_before_is_used(tmp_path, damage, words):
    folder = tmp_path / "checkpoints"
    older, newer = write(folder, 3, 6)
    damage(newer.path, newer.manifest_path)
    said: list[str] = []
    found, damaged = checkpoint.newest(folder, said.append)
    assert found is not None and found.step == 3 and found.problem is None
    assert [d.step for d in damaged] == [6] and words in damaged[0].problem
    assert len(said) == 1 and "checkpoints/step-00000006.pt cannot be used" in said[0]
    assert words in said[0] and "trying the one before" in said[0]


def _flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


def test_no_usable_checkpoint_is_none(tmp_path):
    folder = tmp_path / "checkpoints"
    assert checkpoint.newest(folder, print) == (None, [])  # no folder at all
    (only,) = write(folder, 4)
    only.path.write_bytes(b"")
    found, damaged = checkpoint.newest(folder, lambda line: None)
    assert found is None and [d.step for d in damaged] == [4]


def test_keep_prunes_the_oldest_and_what_a_failed_attempt_wrote_past_this_one(tmp_path):
    folder = tmp_path / "checkpoints"
    write(folder, 3, 6, 9, 12)
    checkpoint.prune(folder, keep=2, current=12)
    assert [f.step for f in checkpoint.listing(folder)] == [9, 12]
    assert sorted(p.name for p in folder.iterdir()) == [
        "step-00000009.json", "step-00000009.pt", "step-00000012.json", "step-00000012.pt"]
    # resumed from 9, the run writes 10: 12 belongs to the attempt that failed after it
    write(folder, 10)
    checkpoint.prune(folder, keep=2, current=10)
    assert [f.step for f in checkpoint.listing(folder)] == [9, 10]


def test_an_interrupted_write_leaves_no_file_behind(tmp_path):
    folder = tmp_path / "checkpoints"
    write(folder, 3)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk went away")

    with pytest.raises(RuntimeError, match="disk went away"):
        checkpoint.save(folder, 6, {**run_state(6), "bad": Unpicklable()}, {})
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000003.json", "step-00000003.pt"]
    found, _ = checkpoint.newest(folder, print)
    assert found.step == 3


def test_a_checkpoint_without_its_manifest_does_not_count(tmp_path):
    """A kill between the two renames: the .pt is complete, its manifest never came."""
    folder = tmp_path / "checkpoints"
    older, newer = write(folder, 3, 6)
    newer.manifest_path.unlink()
    found, damaged = checkpoint.newest(folder, lambda line: None)
    assert found.step == 3 and "no manifest" in damaged[0].problem
