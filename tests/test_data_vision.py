"""cifar10, mnist and fashion-mnist read from small files in their real on-disk formats."""
from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from parascale import data
from parascale.config import TrainConfig
from data_files import CIFAR_TEST, CIFAR_TRAIN_PER_BATCH, write_cifar
from parascale.errors import UsageError

CPU = torch.device("cpu")
CIFAR_MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).reshape(1, 3, 1, 1)
CIFAR_STD = torch.tensor([0.2470, 0.2435, 0.2616]).reshape(1, 3, 1, 1)


def test_cifar_fixture_is_in_the_real_format(tmp_path):
    batches = write_cifar(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    assert set(raw) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert raw[b"data"].dtype == np.uint8 and raw[b"data"].shape == (CIFAR_TRAIN_PER_BATCH, 3072)
    assert raw[b"labels"] == batches["data_batch_1"][b"labels"]


def test_plain_torchvision_cifar_insists_on_md5_which_our_loader_replaces(tmp_path):
    from torchvision.datasets import CIFAR10

    write_cifar(tmp_path)
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        CIFAR10(str(tmp_path), train=True, download=False)
    data.check(TrainConfig.of(dataset="cifar10", data_dir=str(tmp_path)))


def test_cifar_batches_hold_the_file_pixels_normalised(tmp_path):
    batches = write_cifar(tmp_path)
    bundle = data.build(TrainConfig.of(dataset="cifar10", data_dir=str(tmp_path)))
    assert (len(bundle.train), len(bundle.test)) == (5 * CIFAR_TRAIN_PER_BATCH, CIFAR_TEST)
    assert bundle.num_classes == 10 and bundle.input_shape == (3, 32, 32)
    raw = np.concatenate([batches[f"data_batch_{i}"][b"data"] for i in range(1, 6)])
    labels = sum((batches[f"data_batch_{i}"][b"labels"] for i in range(1, 6)), [])
    order = [7, 0, 3]
    x, y = next(bundle.train.batches([order], CPU, train=True))
    pixels = torch.from_numpy(raw[order]).reshape(3, 3, 32, 32).float() / 255
    torch.testing.assert_close(x, (pixels - CIFAR_MEAN) / CIFAR_STD)
    assert y.tolist() == [labels[i] for i in order] and y.dtype == torch.int64
    _, y_test = next(bundle.test.batches([[2, 1]], CPU, train=False))
    assert y_test.tolist() == [batches["test_batch"][b"labels"][i] for i in (2, 1)]


def test_cifar_resize_gives_the_configured_shape(tmp_path):
    write_cifar(tmp_path)
    bundle = data.build(TrainConfig.of(dataset="cifar10", data_dir=str(tmp_path), image_size=48))
    assert bundle.input_shape == (3, 48, 48)
    x, _ = next(bundle.test.batches([[0, 1]], CPU, train=False))
    assert x.shape == (2, 3, 48, 48)


def test_cifar_missing_folder_and_files_are_one_line_errors(tmp_path):
    cfg = TrainConfig.of(dataset="cifar10", data_dir=str(tmp_path))
    with pytest.raises(UsageError) as err:
        data.check(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert f"no cifar-10-batches-py in {tmp_path}" in message
    assert "data_batch_1..5" in message and "test_batch" in message and "--download" in message

    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    for call in (data.check, data.build):  # build must not leak torchvision's RuntimeError
        with pytest.raises(UsageError, match="lacks data_batch_3, test_batch"):
            call(cfg)


def test_cifar_corrupt_file_is_a_usage_error_from_build(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(UsageError, match="cifar10: could not read .*data_batch_1..5") as err:
        data.build(TrainConfig.of(dataset="cifar10", data_dir=str(tmp_path)))
    assert "\n" not in str(err.value)


def test_download_flag_with_files_present_uses_them_without_network(tmp_path):
    write_cifar(tmp_path)
    cfg = TrainConfig.of(dataset="cifar10", data_dir=str(tmp_path), download=True)
    data.check(cfg)
    assert len(data.build(cfg).train) == 5 * CIFAR_TRAIN_PER_BATCH


# --- MNIST IDX files -----------------------------------------------------------------------------

def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX: big-endian magic 0x0000 <type 0x08 = ubyte> <ndim>, then big-endian dims, then data."""
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, folder: str, n_train: int = 6, n_test: int = 4) -> dict[str, np.ndarray]:
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    for name, array in arrays.items():
        write_idx(raw / name, array)
    return arrays


@pytest.mark.parametrize("name, folder, mean, std", [
    ("mnist", "MNIST", 0.1307, 0.3081), ("fashion-mnist", "FashionMNIST", 0.2860, 0.3530)])
def test_mnist_family_reads_idx_files(tmp_path, name, folder, mean, std):
    arrays = write_mnist(tmp_path, folder)
    cfg = TrainConfig.of(dataset=name, data_dir=str(tmp_path))
    data.check(cfg)
    bundle = data.build(cfg)
    assert (len(bundle.train), len(bundle.test), bundle.input_shape) == (6, 4, (1, 28, 28))
    x, y = next(bundle.train.batches([torch.tensor([5, 1])], CPU, train=True))
    pixels = torch.from_numpy(arrays["train-images-idx3-ubyte"][[5, 1]]).float().unsqueeze(1) / 255
    torch.testing.assert_close(x, (pixels - mean) / std)
    assert y.tolist() == arrays["train-labels-idx1-ubyte"][[5, 1]].tolist()


def test_mnist_errors_name_the_expected_layout(tmp_path):
    write_mnist(tmp_path, "MNIST")  # present, but fashion-mnist looks in FashionMNIST/raw
    with pytest.raises(UsageError) as err:
        data.check(TrainConfig.of(dataset="fashion-mnist", data_dir=str(tmp_path)))
    message = str(err.value)
    assert f"no FashionMNIST/raw in {tmp_path}" in message and "t10k-labels-idx1-ubyte" in message
    assert "--download" in message and "\n" not in message

    raw = tmp_path / "MNIST" / "raw"
    (raw / "t10k-images-idx3-ubyte").rename(raw / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(UsageError, match=r"lacks t10k-images-idx3-ubyte; .*\(gunzip the .gz"):
        data.check(TrainConfig.of(dataset="mnist", data_dir=str(tmp_path)))


def test_mnist_bad_magic_is_a_usage_error(tmp_path):
    write_mnist(tmp_path, "MNIST")
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x00\x00" + path.read_bytes()[4:])
    with pytest.raises(UsageError, match="mnist: could not read"):
        data.build(TrainConfig.of(dataset="mnist", data_dir=str(tmp_path)))
