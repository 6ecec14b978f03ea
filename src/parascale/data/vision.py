"""torchvision's small image datasets, held in memory: cifar10, mnist, fashion-mnist.

torchvision parses the files; we keep its `.data` uint8 array as one tensor so batches need
no per-sample work (see `parascale.data.split`). torchvision is imported only when used.
"""
from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parascale import lazy
from parascale.config import TrainConfig
from parascale.data.paths import data_dir, first_line
from parascale.errors import UsageError

if TYPE_CHECKING:
    import torch

    from parascale.data.split import DataBundle, TensorSplit
else:  # check() reads only the folder, without torch; building imports it
    torch = lazy.module("torch", globals())

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class VisionSpec:
    """Where a dataset's files live under --data-dir, and its statistics."""

    folder: str                        # relative to --data-dir
    files: tuple[str, ...]             # all must exist in `folder`
    describe: str                      # the expected files, for messages
    mean: tuple[float, ...]
    std: tuple[float, ...]
    shape: tuple[int, int, int]        # (C, H, W) as stored
    legacy: tuple[str, ...] = ()       # alternative complete set of files (torchvision's old cache)


SPECS: dict[str, VisionSpec] = {
    "cifar10": VisionSpec(
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta"),
        "data_batch_1..5, test_batch and batches.meta",
        # Per-channel statistics of the 50,000 training images (the std, not the often copied
        # 0.2023/0.1994/0.2010, which averages per-image stds).
        (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), (3, 32, 32)),
    "mnist": VisionSpec(
        "MNIST/raw", MNIST_FILES, ", ".join(MNIST_FILES) + " (uncompressed)",
        (0.1307,), (0.3081,), (1, 28, 28),
        legacy=("../processed/training.pt", "../processed/test.pt")),
    "fashion-mnist": VisionSpec(
        "FashionMNIST/raw", MNIST_FILES, ", ".join(MNIST_FILES) + " (uncompressed)",
        (0.2860,), (0.3530,), (1, 28, 28),
        legacy=("../processed/training.pt", "../processed/test.pt")),
}


@functools.cache
def _dataset_class(name: str) -> type:
    import torchvision.datasets as tvd

    if name == "mnist":
        return tvd.MNIST  # checks only that the files exist
    if name == "fashion-mnist":
        return tvd.FashionMNIST

    class PresenceCheckedCIFAR10(tvd.CIFAR10):
        """CIFAR10 whose integrity check is "the files exist" instead of an md5 of each.

        torchvision hashes all ~180 MB on every construction, i.e. in every worker of every
        run, and refuses any other copy of the files (such as small fixtures in the CIFAR
        format). Parsing is untouched: a truncated or corrupt batch still fails to unpickle
        or reshape, and --download still verifies the md5 of the downloaded archive.
        """

        train_list = [[file, None] for file, _ in tvd.CIFAR10.train_list]
        test_list = [[file, None] for file, _ in tvd.CIFAR10.test_list]
        meta = {**tvd.CIFAR10.meta, "md5": None}

    return PresenceCheckedCIFAR10


def _problem(cfg: TrainConfig, spec: VisionSpec) -> str | None:
    """What is missing under --data-dir, as a one-line message, or None if all is there."""
    root = data_dir(cfg, f"{spec.folder}/")
    folder = root / spec.folder
    if cfg.data.download:
        return None  # torchvision fetches whatever is missing
    if spec.legacy and all((folder / f).is_file() for f in spec.legacy):
        return None
    expected = f"expected {folder}/{spec.describe}"
    if not folder.is_dir():
        return f"{cfg.data.dataset}: no {spec.folder} in {root}; {expected} (or pass --download)"
    missing = [f for f in spec.files if not (folder / f).is_file()]
    if missing:
        # torchvision only extracts archives while downloading, so a .gz alone is "missing"
        gz = any((folder / f"{f}.gz").is_file() for f in missing)
        hint = "gunzip the .gz files there, or pass --download" if gz else "or pass --download"
        return f"{cfg.data.dataset}: {folder} lacks {', '.join(missing)}; {expected} ({hint})"
    return None


def check(cfg: TrainConfig) -> None:
    """Fail fast on missing files; with --download, fetch them here, once, so that the
    workers (which all call `build`) find them present instead of racing to download."""
    spec = SPECS[cfg.data.dataset]
    problem = _problem(cfg, spec)
    if problem:
        raise UsageError(problem)
    if cfg.data.download:
        _load(cfg, train=True)


def _load(cfg: TrainConfig, *, train: bool):
    """The torchvision dataset; its errors (missing, corrupt, download failed) as UsageError."""
    spec = SPECS[cfg.data.dataset]
    root = str(Path(cfg.data.data_dir).expanduser())
    try:
        return _dataset_class(cfg.data.dataset)(root, train=train, download=cfg.data.download)
    except (RuntimeError, OSError, ValueError, TypeError, AssertionError, EOFError, KeyError,
            pickle.UnpicklingError) as error:
        problem = _problem(cfg, spec)
        if problem:  # the files vanished since check()
            raise UsageError(problem) from error
        action = "download into" if cfg.data.download else "read"
        raise UsageError(f"{cfg.data.dataset}: could not {action} {Path(root) / spec.folder}: "
                         f"{first_line(error)}; expected {spec.describe} there "
                         "(delete them and pass --download to fetch them again)") from error


def _split(cfg: TrainConfig, spec: VisionSpec, *, train: bool) -> TensorSplit:
    from parascale.data.split import TensorSplit

    ds = _load(cfg, train=train)
    data = ds.data
    if isinstance(data, torch.Tensor):  # MNIST family: (N, H, W) uint8 tensor
        x = data.unsqueeze(1)
    else:  # CIFAR: (N, H, W, C) uint8 numpy array
        x = torch.from_numpy(data).permute(0, 3, 1, 2)
    y = torch.as_tensor(ds.targets, dtype=torch.long)
    x = x.contiguous()  # one layout for fast index_select
    labels_ok = len(y) == 0 or (int(y.min()) >= 0 and int(y.max()) < 10)
    if x.shape[1:] != spec.shape or len(y) != len(x) or not labels_ok:
        raise UsageError(f"{cfg.data.dataset}: files in {Path(cfg.data.data_dir) / spec.folder} "
                         f"hold {len(x)} samples of shape {tuple(x.shape[1:])} with {len(y)} "
                         f"labels; expected shape {spec.shape} and labels 0..9 for each sample")
    return TensorSplit(x, y, spec.mean, spec.std, scale=1 / 255, image_size=cfg.data.image_size,
                       augment=cfg.data.augment and train)


def stamp(cfg: TrainConfig) -> list:
    """The source, for ``data.handover``: name, size and time of each file the data is read
    from, so that files replaced between two runs of one process are read again."""
    spec = SPECS[cfg.data.dataset]
    folder = Path(cfg.data.data_dir).expanduser() / spec.folder
    facts = []
    for name in (*spec.files, *spec.legacy):
        try:
            info = (folder / name).stat()
        except OSError:
            continue
        facts.append([name, info.st_size, info.st_mtime_ns])
    return facts


def build(cfg: TrainConfig) -> DataBundle:
    from parascale.data.split import DataBundle

    spec = SPECS[cfg.data.dataset]
    problem = _problem(cfg, spec)
    if problem:
        raise UsageError(problem)
    c, h, w = spec.shape
    size = cfg.data.image_size
    return DataBundle(
        name=cfg.data.dataset,
        train=_split(cfg, spec, train=True),
        test=_split(cfg, spec, train=False),
        num_classes=10,
        input_shape=(c, size, size) if size else (c, h, w),
    )
