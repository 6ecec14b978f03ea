"""The registry's names and errors, and the file-free datasets: synthetic and digits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from parascale import data
from parascale.config import TrainConfig
from parascale.errors import UsageError

CPU = torch.device("cpu")
ALL = ["synthetic", "digits", "cifar10", "mnist", "fashion-mnist", "imagefolder", "shakespeare"]


def everything(split: data.Split) -> tuple[torch.Tensor, torch.Tensor]:
    return next(split.batches([list(range(len(split)))], CPU, train=False))


def test_names():
    assert data.names() == ALL


@pytest.mark.parametrize("call", [data.check, data.build])
def test_unknown_name_lists_the_valid_ones(call):
    with pytest.raises(UsageError) as err:
        call(TrainConfig.of(dataset="cifar100"))
    message = str(err.value)
    assert "unknown dataset 'cifar100'" in message and "\n" not in message
    assert all(name in message for name in ALL)


@pytest.mark.parametrize("name", ["cifar10", "mnist", "fashion-mnist", "imagefolder"])
def test_file_datasets_need_a_data_dir(name):
    with pytest.raises(UsageError, match=f"^{name} needs --data-dir: a folder holding "):
        data.check(TrainConfig.of(dataset=name))


def test_missing_or_non_folder_data_dir(tmp_path):
    with pytest.raises(UsageError, match="--data-dir .*nowhere does not exist; expected a folder"):
        data.check(TrainConfig.of(dataset="mnist", data_dir=str(tmp_path / "nowhere")))
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        data.check(TrainConfig.of(dataset="cifar10", data_dir=str(tmp_path / "file")))


def test_digits_split_sizes_shape_and_fixed_test_set():
    data.check(TrainConfig.of(dataset="digits"))
    a = data.build(TrainConfig.of(dataset="digits", seed=1))
    b = data.build(TrainConfig.of(dataset="digits", seed=2))
    assert (len(a.train), len(a.test), a.num_classes, a.input_shape) == (1437, 360, 10, (1, 8, 8))
    x, y = everything(a.train)
    assert x.shape == (1437, 1, 8, 8) and x.dtype == torch.float32
    assert abs(x.mean().item()) < 1e-4 and abs(x.std().item() - 1) < 1e-3
    x_test, y_test = everything(a.test)
    assert set(torch.bincount(y_test, minlength=10).tolist()) <= {35, 36, 37}  # stratified
    assert torch.equal(x_test, everything(b.test)[0]) and torch.equal(y_test, everything(b.test)[1])


def test_the_stored_digits_split_is_the_one_scikit_learn_draws():
    """Digits are read without importing scikit-learn: its data file, read as load_digits()
    reads it, and its split, stored (data/digits_split.py), as train_test_split draws it."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from parascale.data import builtin, digits_split

    digits = load_digits()
    train, test = train_test_split(np.arange(len(digits.target)), test_size=builtin.DIGITS_TEST,
                                   random_state=builtin.DIGITS_SPLIT_SEED, stratify=digits.target)
    assert digits_split.TRAIN == tuple(train.tolist())
    assert digits_split.TEST == tuple(test.tolist())
    images, labels = builtin.digits_arrays()
    assert np.array_equal(images, digits.images) and np.array_equal(labels, digits.target)


def test_digits_are_scikit_learns_images_scaled_to_unit_range():
    from sklearn.datasets import load_digits

    bundle = data.build(TrainConfig.of(dataset="digits"))
    images = torch.from_numpy(load_digits().images.astype(np.float32) / 16)
    x = bundle.train.x  # stored in [0, 1] before normalisation
    assert 0 <= x.min() and x.max() == 1
    assert any(torch.equal(x[0, 0], img) for img in images)


def test_synthetic_sizes_labels_and_determinism():
    cfg = TrainConfig.of(dataset="synthetic", synthetic_shape=(2, 5, 7), synthetic_size=40,
                         num_classes=3, seed=4)
    bundle = data.build(cfg)
    assert (len(bundle.train), len(bundle.test)) == (40, 10)
    assert (bundle.num_classes, bundle.input_shape) == (3, (2, 5, 7))
    x, y = everything(bundle.train)
    assert x.shape == (40, 2, 5, 7) and set(y.tolist()) <= {0, 1, 2}
    assert abs(x.mean().item()) < 0.2
    again = everything(data.build(cfg).train)
    other = everything(data.build(TrainConfig.of(**{**cfg.to_dict(), "seed": 5,
                                                    "synthetic_shape": (2, 5, 7)})).train)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, other[0])


def test_synthetic_tiny_test_split_and_resize():
    bundle = data.build(TrainConfig.of(dataset="synthetic", synthetic_size=3, image_size=16))
    assert (len(bundle.test), bundle.input_shape) == (1, (3, 16, 16))
    assert everything(bundle.test)[0].shape == (1, 3, 16, 16)


def test_synthetic_labels_are_learnable():
    from sklearn.linear_model import LogisticRegression

    bundle = data.build(TrainConfig.of(dataset="synthetic", synthetic_shape=(3, 8, 8),
                                       synthetic_size=2000))
    (x, y), (xt, yt) = everything(bundle.train), everything(bundle.test)
    model = LogisticRegression(max_iter=300).fit(x.flatten(1).numpy(), y.numpy())
    assert model.score(xt.flatten(1).numpy(), yt.numpy()) > 0.5  # chance is 0.1
