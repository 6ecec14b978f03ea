"""Checkpoints whose checksum matches but whose content is not a run's (a bug, a hand edit, a
forgery): each is named, one line, and the one before it is used."""
from __future__ import annotations

import hashlib
import io
import json

import pytest
import torch

from conftest import run_state
from parascale.config import TrainConfig
from parascale.training.checkpoint import disk as checkpoint
from parascale.training.checkpoint import resume


def torch_bytes(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def without(state: dict, path: str) -> dict:
    part = state
    *parents, last = path.split(".")
    for key in parents:
        part = part[int(key)] if isinstance(part, list) else part[key]
    del part[last]
    return state


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


PT = {  # what the .pt holds instead of a run's state
    "garbage": (b"\x80not a torch file" * 64, "torch cannot load it ("),
    "a list": (torch_bytes([1, 2, 3]), "it holds a list, not a run's state"),
    "no ranks": (torch_bytes(without(run_state(6, 2), "ranks")), "its state has no ranks"),
    "no rng": (torch_bytes(without(run_state(6, 2), "ranks.1.rng")),
               "its state has no ranks.1.rng"),
    "no model": (torch_bytes(without(run_state(6, 2), "shared.model")),
                 "its state has no shared.model"),
    "step as text": (torch_bytes({**run_state(6, 2), "position": {"step": "6", "epoch": 2,
                                                                  "done": 0}}),
                     "its state is malformed (position.step is str, expected an integer)"),
    "other step": (torch_bytes(run_state(5, 2)), "its state is at step 5 where its manifest"),
    "one rank": (torch_bytes(run_state(6, 1)), "its state has 1 rank(s) where its manifest says 2"),
    "deep": (torch_bytes({**run_state(6, 2), "progress": {"epochs": json.loads(deep(200))}}),
             "its state is malformed (nested more than 64 levels deep at progress.epochs"),
}
MANIFEST = {  # what changes in the manifest
    "no step": (lambda m: m.pop("step"), "its manifest has no step"),
    "epoch abc": (lambda m: m.update(epoch="abc"),
                  "its manifest is invalid (epoch is str, expected an integer)"),
    "config a string": (lambda m: m.update(config="lr=0.1"),
                        "its manifest is invalid (config is str, expected an object)"),
    "no world size": (lambda m: m.pop("world_size"), "its manifest has no world_size"),
    "other step": (lambda m: m.update(step=7), "its manifest is for step 7"),
}


def two_checkpoints(tmp_path) -> tuple[TrainConfig, checkpoint.Found]:
    cfg = TrainConfig.of(workers=2, out=str(tmp_path), checkpoint_every=3, resume=True)
    for step in (3, 6):
        newer = checkpoint.save(checkpoint.folder_of(tmp_path), step, run_state(step, 2),
                                {"epoch": 2, "world_size": 2, "config": cfg.to_dict()})
    return cfg, newer


def resigned(found: checkpoint.Found, pt: bytes | None = None, manifest_text: str | None = None):
    """Damage ``found`` while keeping its manifest's size and checksum right."""
    if pt is not None:
        found.path.write_bytes(pt)
    manifest = json.loads(found.manifest_path.read_text())
    manifest.update(bytes=found.path.stat().st_size,
                    sha256=hashlib.sha256(found.path.read_bytes()).hexdigest())
    found.manifest_path.write_text(manifest_text or json.dumps(manifest))
    return manifest


def chosen_instead(cfg: TrainConfig, words: str) -> None:
    said: list[str] = []
    choice = resume.first_choice(cfg, 2, 12, said.append)
    assert choice is not None and choice.step == 3, said
    assert len(said) == 1 and said[0].startswith(
        "parascale: checkpoint checkpoints/step-00000006.pt cannot be used: "), said
    assert words in said[0] and said[0].endswith("; trying the one before"), said
    assert choice.skipped[0]["checkpoint"] == "checkpoints/step-00000006.pt"
    assert words in choice.skipped[0]["problem"]


@pytest.mark.parametrize("case", PT)
def test_a_pt_that_is_not_a_runs_state_is_named_and_the_one_before_used(tmp_path, case):
    cfg, newer = two_checkpoints(tmp_path)
    content, words = PT[case]
    resigned(newer, pt=content)
    chosen_instead(cfg, words)


@pytest.mark.parametrize("case", MANIFEST)
def test_a_manifest_that_is_not_a_checkpoints_is_named_and_the_one_before_used(tmp_path, case):
    cfg, newer = two_checkpoints(tmp_path)
    change, words = MANIFEST[case]
    manifest = resigned(newer)
    change(manifest)
    newer.manifest_path.write_text(json.dumps(manifest))
    chosen_instead(cfg, words)


def test_a_deeply_nested_manifest_is_named_and_the_one_before_used(tmp_path):
    cfg, newer = two_checkpoints(tmp_path)
    manifest = resigned(newer)
    text = json.dumps({**manifest, "config": "NEST"}).replace('"NEST"', deep(100_000))
    newer.manifest_path.write_text(text)
    chosen_instead(cfg, "its manifest is unreadable (nested more than 64 levels deep")
