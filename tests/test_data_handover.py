"""The launcher's data handed to its workers as a file: the same batches, never stale data."""
from __future__ import annotations

import os

import pytest
import torch

from parascale import data
from parascale.config import TrainConfig
from parascale.data import handover, vision
from data_files import write_cifar

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """Each test starts with nothing prepared, and its files in its own folder."""
    monkeypatch.setattr(handover, "_PREPARED", {})
    monkeypatch.setattr(handover, "_folder", tmp_path / "handover")
    (tmp_path / "handover").mkdir()
    monkeypatch.delenv(handover.ENV, raising=False)


def batches(bundle, train=True):
    seed = torch.Generator().manual_seed(3)
    order = [list(range(len(bundle.train if train else bundle.test)))]
    split = bundle.train if train else bundle.test
    return next(split.batches(order, CPU, train=train, generator=seed))


def same(a, b):
    assert (a.name, a.num_classes, a.input_shape) == (b.name, b.num_classes, b.input_shape)
    for train in (True, False):
        (xa, ya), (xb, yb) = batches(a, train), batches(b, train)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def handed(cfg, monkeypatch):
    env = data.handover_env(cfg)
    assert set(env) == {handover.ENV}
    monkeypatch.setenv(handover.ENV, env[handover.ENV])
    return data.build(cfg)


@pytest.mark.parametrize("cfg", [
    TrainConfig.of(dataset="digits", image_size=12, augment=True),
    TrainConfig.of(dataset="synthetic", synthetic_size=40, synthetic_shape=(3, 8, 8),
                   num_classes=4),
], ids=["digits", "synthetic"])
def test_workers_get_the_batches_they_would_have_built(cfg, monkeypatch):
    facts = data.prepare(cfg, keep=True)
    own = data.build(cfg)
    assert facts == {"train": len(own.train), "test": len(own.test),
                     "num_classes": own.num_classes, "input_shape": own.input_shape, "val": 0}
    same(handed(cfg, monkeypatch), own)


def test_cifar_files_are_handed_over_and_read_again_once_replaced(tmp_path, monkeypatch):
    root = tmp_path / "data"
    write_cifar(root)
    cfg = TrainConfig.of(dataset="cifar10", data_dir=str(root))
    data.prepare(cfg, keep=True)
    own = data.build(cfg)
    first = data.handover_env(cfg)[handover.ENV]
    same(handed(cfg, monkeypatch), own)
    data.prepare(cfg, keep=True)
    assert data.handover_env(cfg)[handover.ENV] == first  # built once in this process
    # a file replaced under the same name: neither the launcher nor a worker reuses the old data
    os.utime(root / "cifar-10-batches-py" / "data_batch_1", ns=(1, 1))
    assert data.handover_env(cfg) == {}
    assert handover.take(cfg, vision) is None  # the environment still names the old file
    data.prepare(cfg, keep=True)
    assert data.handover_env(cfg)[handover.ENV] != first


def test_a_worker_whose_data_differs_builds_its_own(monkeypatch):
    launcher = TrainConfig.of(dataset="digits", image_size=12)
    data.prepare(launcher, keep=True)
    monkeypatch.setenv(handover.ENV, data.handover_env(launcher)[handover.ENV])
    other = TrainConfig.of(dataset="digits", image_size=16)
    assert data.build(other).input_shape == (1, 16, 16)
    monkeypatch.setenv(handover.ENV, "/nonexistent/data.pt")
    assert data.build(launcher).input_shape == (1, 12, 12)


def test_not_kept_under_an_external_launcher(tmp_path):
    cfg = TrainConfig.of(dataset="digits")
    data.prepare(cfg, keep=False)
    assert data.handover_env(cfg) == {}
    assert list((tmp_path / "handover").iterdir()) == []
    data.prepare(cfg, keep=True)  # a later launch in the same process keeps it
    assert data.handover_env(cfg)


def test_data_read_sample_by_sample_is_not_handed_over(tmp_path):
    from parascale.data import folder

    cfg = TrainConfig.of(dataset="imagefolder", data_dir=str(tmp_path))
    assert handover.key(cfg, folder) is None


def test_the_file_is_whole_or_absent(tmp_path):
    data.prepare(TrainConfig.of(dataset="digits"), keep=True)
    names = [p.name for p in (tmp_path / "handover").iterdir()]
    assert names == ["data-0.pt"]  # no .tmp left behind


def test_the_corpus_is_encoded_once_by_the_launcher_and_handed_over(monkeypatch):
    """--dataset shakespeare was built again by every check of a study's configurations and by
    every worker (0.3 s of encoding each); it is kept and mapped as the image data is."""
    from parascale.data import text

    cfg = TrainConfig.of(model="gpt", dataset="shakespeare", context=16)
    facts = data.prepare(cfg, keep=True)
    own = data.build(cfg)
    assert facts["train"] == len(own.train) and facts["num_classes"] == own.num_classes

    def no_second_build(*_):
        raise AssertionError("the corpus was read and encoded again")

    monkeypatch.setattr(text, "corpus", no_second_build)
    assert data.prepare(cfg, keep=True) == facts
    same(handed(cfg, monkeypatch), own)
