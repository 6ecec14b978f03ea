"""Datasets that need no files: `synthetic` (generated) and `digits` (ships with scikit-learn)."""
from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.config import TrainConfig

if TYPE_CHECKING:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from parascale.data.split import DataBundle
else:  # check() runs without torch, before it is needed; build() imports it
    np = lazy.module("numpy", globals())
    torch = lazy.module("torch", globals())
    F = lazy.module("torch.nn.functional", globals(), "F")

SYNTHETIC_SALT = 0x5EED_DA7A
"""Added to cfg.job.seed so the synthetic samples do not replay the stream that seeds the model."""

DIGITS_SPLIT_SEED = 0
"""Fixed (not cfg.job.seed) so every run, whatever its seed, is tested on the same 360 digits."""
DIGITS_TEST = 360


def check(cfg: TrainConfig) -> None:
    """Nothing to check: config validation already covers the synthetic options."""


def stamp(cfg: TrainConfig) -> str:
    """The source, for ``data.handover``: none beyond the configuration (scikit-learn's digits
    do not change while a process runs)."""
    return "built-in"


def build(cfg: TrainConfig) -> DataBundle:
    return _synthetic(cfg) if cfg.data.dataset == "synthetic" else _digits(cfg)


def _synthetic(cfg: TrainConfig) -> DataBundle:
    """Gaussian samples labelled by the argmax of a fixed random projection of a coarse
    (at most 4x4) average-pooled view of each sample.

    The labels are a deterministic function of the input that both an MLP and a CNN with
    pooling can learn, so accuracy on the test split means something. Same on every rank.
    """
    from parascale.data.split import DataBundle, TensorSplit

    c, h, w = cfg.data.synthetic_shape
    n_train = cfg.data.synthetic_size
    n_test = max(1, n_train // 4)
    gen = torch.Generator().manual_seed(cfg.job.seed + SYNTHETIC_SALT)
    x = torch.randn((n_train + n_test, c, h, w), generator=gen)
    grid = (min(4, h), min(4, w))
    projection = torch.randn((c * grid[0] * grid[1], cfg.data.num_classes), generator=gen)
    # Unit-norm columns give every class score the same distribution: balanced classes.
    projection /= projection.norm(dim=0, keepdim=True)
    y = (F.adaptive_avg_pool2d(x, grid).flatten(1) @ projection).argmax(1)
    # randn is already zero-mean, unit-variance: normalisation is the identity.
    mean, std = [0.0] * c, [1.0] * c
    split: dict[str, Any] = dict(image_size=cfg.data.image_size)
    size = cfg.data.image_size
    return DataBundle(
        name="synthetic",
        train=TensorSplit(x[:n_train], y[:n_train], mean, std, augment=cfg.data.augment, **split),
        test=TensorSplit(x[n_train:], y[n_train:], mean, std, **split),
        num_classes=cfg.data.num_classes,
        input_shape=(c, size, size) if size else (c, h, w),
    )


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``load_digits()`` gives them, (images (1797, 8, 8) of 0..16,
    labels), read from its data file as it reads it, without importing scikit-learn (which
    imports SciPy: seconds on every run's start); through it where the file is not found."""
    spec = importlib.util.find_spec("sklearn")  # found, not imported
    folder = Path(list(spec.submodule_search_locations)[0]) if spec is not None and \
        spec.submodule_search_locations else None
    path = folder / "datasets" / "data" / "digits.csv.gz" if folder is not None else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.images, digits.target
    with gzip.open(path, mode="rt", encoding="utf-8") as text:
        data = np.loadtxt(text, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def _digits(cfg: TrainConfig) -> DataBundle:
    """scikit-learn's 1,797 8x8 handwritten digits, 1,437 train / 360 test (stratified: the
    split stored in :mod:`.digits_split`)."""
    from parascale.data import digits_split
    from parascale.data.split import DataBundle, TensorSplit

    images, labels = digits_arrays()
    x = torch.from_numpy((images / 16.0).astype(np.float32)).unsqueeze(1)  # [0, 1]
    y = torch.from_numpy(labels.astype(np.int64))
    train_idx, test_idx = torch.tensor(digits_split.TRAIN), torch.tensor(digits_split.TEST)
    # Statistics of the fixed training split, so they too are the same for every run.
    mean, std = x[train_idx].mean().item(), x[train_idx].std().item()
    split: dict[str, Any] = dict(image_size=cfg.data.image_size)
    size = cfg.data.image_size
    return DataBundle(
        name="digits",
        train=TensorSplit(x[train_idx], y[train_idx], [mean], [std], augment=cfg.data.augment,
                          **split),
        test=TensorSplit(x[test_idx], y[test_idx], [mean], [std], **split),
        num_classes=10,
        input_shape=(1, size, size) if size else (1, 8, 8),
    )
