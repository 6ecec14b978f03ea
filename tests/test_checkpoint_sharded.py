"""Sharded checkpoints (--sync zero, fsdp): every rank's part through torch.distributed.checkpoint
in a folder committed by rename, checked file by file like a .pt, and resumed on another number
of workers than wrote it, ending where a run never stopped does."""
from __future__ import annotations

import os
import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import STEPS, assert_same, fill_disk, run_state, run_training

from parascale.config import TrainConfig
from parascale.errors import NoSpace
from parascale.training.checkpoint import disk as checkpoint
from parascale.training.checkpoint import resume


def written(folder, step: int, world_size: int = 2, big: int = 0) -> checkpoint.Found:
    """A sharded checkpoint as a run commits it: DCP's files (one process, no world), run.pt
    (``big`` more bytes in it) and the manifest."""
    tmp = checkpoint.temporary(folder, step)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": {"w": torch.full((4, 4), float(step))}}, checkpoint_id=tmp,
                 no_dist=True)
    return checkpoint.commit(folder, step, {**run_state(step, world_size), "sharded": True,
                                            "shared": {"scaler": None},
                                            "big": torch.ones(big // 4)},
                             {"epoch": 2, "world_size": world_size, "config": {},
                              "global_batch": 32, "effective_lr": 0.1}, {})


def newest(folder) -> tuple[checkpoint.Found | None, list[str]]:
    lines: list[str] = []
    found, _ = checkpoint.newest(folder, lines.append)
    return found, lines


def test_a_committed_folder_verifies_and_its_temporary_is_gone(tmp_path):
    found = written(tmp_path, 3)
    assert found.label == f"{tmp_path.name}/step-00000003/"
    assert sorted(os.listdir(found.path)) == [".metadata", "__0_0.distcp", "run.pt"]
    assert sorted(found.manifest["files"]) == sorted(os.listdir(found.path))
    assert not checkpoint.temporary(tmp_path, 3).exists()
    chosen, lines = newest(tmp_path)
    assert (chosen.path, chosen.problem, lines) == (found.path, None, [])
    assert checkpoint.load(found)["sharded"] is True


@pytest.mark.parametrize("damage, message", [
    (lambda p: (p / "__0_0.distcp").write_bytes(b"x" * (p / "__0_0.distcp").stat().st_size),
     "its __0_0.distcp's SHA-256 checksum does not match its manifest (corrupted)"),
    (lambda p: (p / "__0_0.distcp").unlink(), "it lacks __0_0.distcp"),
    (lambda p: (p / "__1_0.distcp").write_bytes(b""), "it holds __1_0.distcp, which its manifest"),
    (lambda p: os.truncate(p / "run.pt", 10), "its run.pt has 10 bytes where its manifest says"),
    (lambda p: p.with_suffix(".json").unlink(), "it has no manifest (the write did not finish)"),
])
def test_a_damaged_folder_is_named_and_the_one_before_is_used(tmp_path, damage, message):
    written(tmp_path, 3)
    damaged = written(tmp_path, 6)
    damage(damaged.path)
    found, lines = newest(tmp_path)
    assert found.step == 3
    (line,) = lines
    assert line.startswith(f"parascale: checkpoint {tmp_path.name}/step-00000006/ cannot be used:")
    assert message in line and line.endswith("trying the one before")


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_forged_metadata_is_refused_without_running_it(tmp_path, monkeypatch):
    """A checksum vouches against damage, not forgery: DCP's pickled .metadata is read by an
    unpickler that builds its own classes only."""
    monkeypatch.chdir(tmp_path)
    written(tmp_path, 3)
    forged = written(tmp_path, 6)
    (forged.path / ".metadata").write_bytes(pickle.dumps(_Boom()))
    facts = {**forged.manifest["files"], ".metadata": checkpoint.file_facts(
        forged.path / ".metadata")}  # the forger rewrites the manifest too
    forged.path.with_suffix(".json").unlink()
    forged.path.rename(checkpoint.temporary(tmp_path, 6))
    os.unlink(checkpoint.temporary(tmp_path, 6) / "run.pt")
    checkpoint.commit(tmp_path, 6, {**run_state(6, 2), "sharded": True, "shared": {}},
                      {"epoch": 2, "world_size": 2, "config": {}}, facts)
    found, (line,) = newest(tmp_path)
    assert found.step == 3
    assert "its .metadata is not torch.distributed.checkpoint's (UnpicklingError: posix.system" \
        in line
    assert not (tmp_path / "pwned").exists()


def resigned(folder, found: checkpoint.Found) -> None:
    """Commit ``found`` again as it now is: its manifest's sizes and checksums made right."""
    facts = {name: checkpoint.file_facts(found.path / name) for name in os.listdir(found.path)
             if name != "run.pt"}
    found.path.with_suffix(".json").unlink()
    found.path.rename(checkpoint.temporary(folder, found.step))
    saved = checkpoint.load(checkpoint.temporary(folder, found.step))
    os.unlink(checkpoint.temporary(folder, found.step) / "run.pt")
    checkpoint.commit(folder, found.step, saved, found.manifest, facts)


def shard_of(tensor: torch.Tensor, folder) -> bytes:
    """The file DCP writes for ``tensor`` alone (as ``written`` does, one process)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": {"w": tensor}}, checkpoint_id=folder, no_dist=True)
    return (folder / "__0_0.distcp").read_bytes()


@pytest.mark.parametrize("tensor, words", [
    (None, "torch cannot load it ("),
    (torch.ones(2, 8), "it holds a tensor of shape [2, 8] where its metadata says [4, 4]"),
    (torch.ones(4, 4, dtype=torch.int32), "it holds torch.int32 where its metadata says "
                                          "torch.float32"),
])
@pytest.mark.filterwarnings("error::UserWarning")  # the one line, not torch's warning beside
def test_a_shard_that_cannot_be_read_is_named_and_the_one_before_is_used(tmp_path, tensor,
                                                                         words):
    """Its checksum matches (the manifest was written again), yet DCP could not read it: the
    resume names it and continues from the checkpoint before, as for any other damage."""
    folder = checkpoint.folder_of(tmp_path)
    cfg = TrainConfig.of(workers=2, out=str(tmp_path), checkpoint_every=3, resume=True)
    written(folder, 3)
    damaged = written(folder, 6)
    shard = damaged.path / "__0_0.distcp"
    size = shard.stat().st_size
    shard.write_bytes(b"\x80not a torch file".ljust(size, b"x") if tensor is None else
                      shard_of(tensor, tmp_path / "other"))
    resigned(folder, damaged)
    said: list[str] = []
    choice = resume.first_choice(cfg, 2, 12, said.append)
    assert choice is not None and choice.step == 3, said
    (line,) = said
    assert line.startswith("parascale: checkpoint checkpoints/step-00000006/ cannot be used: "
                           "its __0_0.distcp (model.w): "), line
    assert words in line and line.endswith("; trying the one before"), line
    assert choice.skipped[0]["checkpoint"] == "checkpoints/step-00000006/"


def test_prune_removes_folders_and_a_killed_writes_temporary(tmp_path):
    for step in (3, 6, 9):
        written(tmp_path, step)
    checkpoint.temporary(tmp_path, 12).mkdir()
    checkpoint.prune(tmp_path, keep=1, current=9)
    assert sorted(os.listdir(tmp_path)) == ["step-00000009", "step-00000009.json"]


def test_a_folder_that_does_not_fit_is_one_line_and_the_one_before_stays(small_disk):
    folder = small_disk / "checkpoints"
    written(folder, 3)
    fill_disk(small_disk, leave=64 << 10)
    with pytest.raises(NoSpace) as refused:
        written(folder, 6, big=256 << 10)
    assert str(refused.value).startswith(
        f"no space left on device: cannot write {folder}/step-00000006")
    assert sorted(os.listdir(folder)) == ["step-00000003", "step-00000003.json"]
    assert newest(folder)[0].step == 3


def _cfg(**options) -> TrainConfig:
    return TrainConfig.of(out="x", global_batch=32, **options)


def test_a_sharded_or_whole_checkpoint_resumes_on_another_worker_count():
    manifest = {"world_size": 2, "config": _cfg(sync="zero", workers=2).to_dict(),
                "files": {"run.pt": {}}, "global_batch": 32, "effective_lr": TrainConfig().optim.lr,
                "step": 6}
    assert resume.mismatch(manifest, _cfg(sync="zero", workers=1), 1, 12) is None
    assert resume.mismatch({**manifest, "config": _cfg(sync="fsdp").to_dict()},
                           _cfg(sync="fsdp"), 4, 12) is None
    # per-device batch given: the global batch would change with the workers
    per_device = {**manifest, "config": {**manifest["config"], "global_batch": None,
                                         "batch_size": 16}}
    assert "global batch of 32 and this run's on 1 worker(s) is 16; give --global-batch 32" in \
        resume.mismatch(per_device, TrainConfig.of(sync="zero", batch_size=16), 1, 12)
    # allreduce keeps the whole state once; local SGD's replicas are each rank's own
    whole = {**manifest, "config": _cfg(sync="allreduce").to_dict()}
    whole.pop("files")
    assert resume.mismatch(whole, _cfg(sync="allreduce"), 1, 12) is None
    replicas = {**whole, "config": _cfg(sync="local-sgd").to_dict()}
    assert "it was written by 2 workers and this run has 1" in \
        resume.mismatch(replicas, _cfg(sync="local-sgd"), 1, 12)
    older = {k: v for k, v in whole.items() if k not in ("global_batch", "effective_lr")}
    assert "it was written by 2 workers" in resume.mismatch(older, _cfg(sync="allreduce"), 1, 12)


def test_the_learning_rate_must_stay_when_the_rule_scales_it():
    cfg = _cfg(sync="zero", lr_scaling="linear", lr=0.1)
    manifest = {"world_size": 2, "config": cfg.to_dict(), "files": {"run.pt": {}},
                "global_batch": 32, "effective_lr": 0.2, "step": 6}  # base 16 a device
    assert resume.mismatch(manifest, cfg, 1, 12).endswith("give --base-batch 16")
    assert resume.mismatch(manifest, _cfg(sync="zero", lr_scaling="linear", lr=0.1,
                                          base_batch=16), 1, 12) is None


# Resuming on another number of workers: the run writes checkpoints after steps 2 and 4 of
# STEPS' 6 (all in epoch 1 at global batch 32), a fault stops it before step 5, and the resume
# from step 4 on the other worker count ends with the uninterrupted run's parameters
CASES = {"zero 2->1": ("zero", {}, 2, 1), "zero 1->2": ("zero", {}, 1, 2),
         "fsdp stage 2 2->1": ("fsdp", {"stage": 2}, 2, 1),
         "fsdp stage 2 1->2": ("fsdp", {"stage": 2}, 1, 2),
         "fsdp stage 3 2->1": ("fsdp", {"stage": 3}, 2, 1),
         "fsdp stage 3 1->2": ("fsdp", {"stage": 3}, 1, 2),
         "allreduce 2->1": ("allreduce", {}, 2, 1)}  # its .pt: the state whole, once


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return run_training(tmp_path_factory.mktemp("whole") / "run", workers=1, global_batch=32,
                        **STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_resumed_on_another_worker_count_ends_where_an_uninterrupted_run_does(
        tmp_path, monkeypatch, uninterrupted, case):
    sync, options, before, after = CASES[case]
    run = dict(global_batch=32, sync=sync, sync_options=options, checkpoint_every=2, **STEPS)
    out = tmp_path / "cut"
    monkeypatch.setenv("PARASCALE_FAULT", "raise@0:5")
    run_training(out, expect="failed", workers=before, **run)
    monkeypatch.delenv("PARASCALE_FAULT")
    kind = "" if sync != "allreduce" else ".pt"  # a sharded one is a folder
    assert set(os.listdir(out / "checkpoints")) - {"log.txt"} == {
        f"step-00000002{kind}", "step-00000002.json", f"step-00000004{kind}",
        "step-00000004.json"}
    record, resumed = run_training(out, resume=True, workers=after, **run)
    assert record["resumed"][0]["checkpoint"] == f"checkpoints/step-00000004{kind or '/'}"
    assert record["derived"]["world_size"] == after
    whole, parameters = uninterrupted
    assert_same(resumed, parameters)
    # the epoch's loss before the checkpoint was shared out among the new ranks, not lost or
    # counted twice
    assert record["epochs"][0]["train_loss"] == pytest.approx(whole["epochs"][0]["train_loss"],
                                                              rel=1e-4)



@pytest.mark.slow
def test_fsdp_resumed_on_the_worker_count_that_wrote_it_is_exact(tmp_path, monkeypatch):
    """2 -> 2: bit for bit the uninterrupted run, as the replicated strategies' resumes (zero's
    is test_sync_zero.py's)."""
    run = dict(workers=2, global_batch=32, sync="fsdp", sync_options={"stage": 3}, **STEPS)
    _, whole = run_training(tmp_path / "whole", **run)
    monkeypatch.setenv("PARASCALE_FAULT", "raise@1:5")
    run_training(tmp_path / "cut", expect="failed", checkpoint_every=2, **run)
    monkeypatch.delenv("PARASCALE_FAULT")
    _, resumed = run_training(tmp_path / "cut", checkpoint_every=2, resume=True, **run)
    assert resumed.keys() == whole.keys()
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("sync, precision", [("zero", "fp16"), ("fsdp", "bf16")])
def test_on_a_gpu_a_sharded_checkpoint_keeps_the_device_state_and_the_scaler(
        tmp_path, monkeypatch, sync, precision):
    """CUDA tensors through DCP and NCCL's collectives (one rank: the only GPU), fp16's
    gradient scaler in run.pt beside them."""
    run = dict(gpus=(0,), model="mlp", dataset="digits", batch_size=32, sync=sync,
               precision=precision, checkpoint_every=3, **STEPS)
    _, whole = run_training(tmp_path / "whole", **{**run, "checkpoint_every": None})
    out = tmp_path / "cut"
    monkeypatch.setenv("PARASCALE_FAULT", "raise@0:5")
    run_training(out, expect="failed", **run)
    monkeypatch.delenv("PARASCALE_FAULT")
    saved = checkpoint.load(out / "checkpoints" / "step-00000003")
    assert saved["sharded"] and (saved["shared"]["scaler"] is not None) == (precision == "fp16")
    record, resumed = run_training(out, resume=True, **run)
    assert record["resumed"][0]["checkpoint"] == "checkpoints/step-00000003/"
    assert_same(resumed, whole, atol=1e-3)
