"""`imagefolder`: images read from files per sample, `<data_dir>/{train,val}/<class>/<image>`.

Too large to hold in memory in general, so each batch is decoded by a DataLoader (optionally
in worker processes); augmentation still runs on the whole batch with the trainer's generator.
Preflight samples one image per class; a file that cannot be read is found when a batch reaches
it, and stops training with one line naming it (:class:`BadImage`), or before any worker starts
with ``--verify-data``, which reads every image.
"""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from parascale import lazy
from parascale.config import TrainConfig
from parascale.runtime.env import available_cores
from parascale.data.paths import data_dir
from parascale.data.split import Batch, DataBundle, IndexBatches, Split, augment, as_index
from parascale.errors import KnownFailure, UsageError

if TYPE_CHECKING:
    import torch
    from torchvision.datasets import ImageFolder
else:  # a missing or empty folder is refused without torch; reading images imports it
    torch = lazy.module("torch", globals())

# ImageNet statistics: the usual choice for natural photos of unknown origin.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
LAYOUT = "train/<class>/<image> and val/<class>/<image> (or test/)"
VERIFY_CHUNK = 4096  # images --verify-data hands its threads at a time


@dataclass(frozen=True)
class Layout:
    train: Path
    test: Path
    classes: list[str]
    shape: tuple[int, int, int]  # (C, H, W) of the batches


class BadImage(KnownFailure):
    """An image file that cannot be read, found during training: one line naming the file."""


def _extensions() -> tuple[str, ...]:
    """The file endings ImageFolder takes for images (torchvision's own list)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return IMG_EXTENSIONS


def _first_image(folder: Path) -> Path | None:
    """The first image below `folder`, in the order ImageFolder lists them (sorted walk)."""
    extensions = _extensions()
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            if name.lower().endswith(extensions):
                return Path(root) / name
    return None


def _size(path: Path) -> tuple[int, int]:
    """(H, W) of an image, reading only its header."""
    try:
        with Image.open(path) as image:
            w, h = image.size
    except OSError as error:
        raise UsageError(f"imagefolder: cannot read image {path}: {error}") from error
    return h, w


def scan(cfg: TrainConfig) -> Layout:
    """Check the folder layout cheaply: class folders, one image per class, and (without
    --image-size) that those sampled images share one size. The full listing is left to
    ImageFolder in each worker."""
    root = data_dir(cfg, LAYOUT)
    train = root / "train"
    test = next((root / n for n in ("val", "test") if (root / n).is_dir()), None)
    if not train.is_dir() or test is None:
        missing = " and ".join(n for n, ok in (("train/", train.is_dir()),
                                               ("val/ (or test/)", test is not None)) if not ok)
        raise UsageError(f"imagefolder: no {missing} in {root}; expected {root}/{LAYOUT}")
    classes = sorted(e.name for e in os.scandir(train) if e.is_dir())
    if not classes:
        raise UsageError(f"imagefolder: no class folders in {train}; expected {train}/<class>/<image>")
    extra = sorted(e.name for e in os.scandir(test) if e.is_dir() and e.name not in classes)
    if extra:
        raise UsageError(f"imagefolder: {test} has classes not in {train}: {', '.join(extra)}; "
                         "the test classes must be a subset of the training classes")
    samples: list[Path] = []
    for cls in classes:
        image = _first_image(train / cls)
        if image is None:
            raise UsageError(f"imagefolder: {train / cls} holds no images; expected files "
                             f"ending {', '.join(_extensions())}")
        samples.append(image)
    test_samples = [p for p in (_first_image(test / c) for c in classes if (test / c).is_dir()) if p]
    if not test_samples:
        raise UsageError(f"imagefolder: no images in {test}; expected {test}/<class>/<image>")
    if cfg.data.image_size:
        return Layout(train, test, classes, (3, cfg.data.image_size, cfg.data.image_size))
    sizes = {p: _size(p) for p in samples + test_samples}
    first = sizes[samples[0]]
    other = next((p for p, s in sizes.items() if s != first), None)
    if other is not None:
        raise UsageError(_size_message(samples[0], first, other, sizes[other]))
    return Layout(train, test, classes, (3, *first))


def _size_message(a: Path, size_a: tuple[int, ...], b: Path, size_b: tuple[int, ...]) -> str:
    return (f"imagefolder: images differ in size ({a} is {size_a[1]}x{size_a[0]}, {b} is "
            f"{size_b[1]}x{size_b[0]}); pass --image-size N to resize them all to NxN")


def check(cfg: TrainConfig) -> None:
    layout = scan(cfg)
    if cfg.data.verify_data:
        verify(cfg, layout)


def verify(cfg: TrainConfig, layout: Layout) -> None:
    """Read every image as training will (decode and transform), on a thread per core, with a
    progress bar once it takes more than a second; one UsageError for all that is wrong."""
    train, test = _datasets(cfg, layout)
    items = [(d, i) for d in (train, test) for i in range(len(d))]
    bad: list[BadImage] = []
    sizes: dict[tuple[int, ...], str] = {}
    with ThreadPoolExecutor(available_cores()) as pool, \
            tqdm(total=len(items), unit="image", desc="verifying data", file=sys.stderr,
                 delay=1.0, disable=None, leave=False) as progress:
        for start in range(0, len(items), VERIFY_CHUNK):  # not a future per image at once
            chunk = items[start:start + VERIFY_CHUNK]
            for (dataset, index), outcome in zip(chunk, pool.map(_read, chunk)):
                progress.update()
                if isinstance(outcome, BadImage):
                    bad.append(outcome)
                else:
                    sizes.setdefault(tuple(outcome.shape), dataset.samples[index][0])
    if bad:
        raise UsageError(f"{bad[0]} ({len(bad)} of {len(items)} images cannot be read; "
                         "--verify-data read them all)")
    if len(sizes) > 1:  # only without --image-size: the batches could not be stacked
        (a, path_a), (b, path_b) = list(sizes.items())[:2]
        raise UsageError(_size_message(Path(path_a), a[1:], Path(path_b), b[1:]))


def _read(item: tuple[ImageFolder, int]) -> torch.Tensor | BadImage:
    dataset, index = item
    try:
        return dataset[index][0]
    except BadImage as error:
        return error


def __getattr__(name: str):
    """``KnownClassesFolder`` by its name, as pickle finds it (a DataLoader's workers started
    by spawn or forkserver are handed the data set pickled)."""
    if name == "KnownClassesFolder":
        return _known_classes_folder()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _known_classes_folder() -> type[ImageFolder]:
    """The ImageFolder the splits read, defined on first use: torchvision imports torch, and
    the layout is checked without it."""
    from torchvision.datasets import ImageFolder

    class KnownClassesFolder(ImageFolder):
        """ImageFolder whose class indices come from the training folder, so a test folder
        that lacks a class does not shift every later label; a file it cannot read is named."""

        def __init__(self, root: str | Path, classes: Sequence[str], **kwargs):
            self._known = list(classes)
            super().__init__(root, **kwargs)

        def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
            return self._known, {c: i for i, c in enumerate(self._known)}

        def __getitem__(self, index: int):
            try:
                return super().__getitem__(index)
            except Exception as error:  # PIL names the file in some errors only ("truncated")
                cause = "not an image PIL can identify" \
                    if isinstance(error, UnidentifiedImageError) \
                    else " ".join(str(error).split())[:200] or type(error).__name__
                raise BadImage(f"imagefolder: cannot read {self.samples[index][0]}: {cause}") \
                    from error

    KnownClassesFolder.__qualname__ = "KnownClassesFolder"  # found by name (__getattr__)
    return KnownClassesFolder


class FolderSplit(Split):
    """Samples decoded per sample by a DataLoader over a torchvision ImageFolder."""

    def __init__(self, dataset: ImageFolder, *, augment: bool = False):
        self.dataset, self.augment = dataset, augment

    def __len__(self) -> int:
        return len(self.dataset)

    def batches(self, index_batches: IndexBatches, device: torch.device, *, train: bool,
                generator: torch.Generator | None = None, loader_workers: int = 0,
                ) -> Iterator[Batch]:
        from torch.utils.data import DataLoader

        device = torch.device(device)
        sampler = [as_index(b).tolist() for b in index_batches]
        loader = DataLoader(self.dataset, batch_sampler=sampler, num_workers=loader_workers,
                            pin_memory=device.type == "cuda")
        try:
            for x, y in loader:
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                if train and self.augment:
                    x = augment(x, generator)
                yield x, y
        except BadImage as error:
            # From a loader worker the message is a traceback ending in the original line.
            last = [line for line in str(error).splitlines() if line.strip()][-1].strip()
            raise BadImage(last.partition(f"{BadImage.__name__}: ")[2] or last) from error
        except RuntimeError as error:
            # default_collate cannot stack images of different sizes; say what to do about it.
            if "stack expects each tensor to be equal size" not in str(error):
                raise
            raise BadImage(f"imagefolder: images in {self.dataset.root} differ in size; "
                           "pass --image-size N to resize them all to NxN (or --verify-data "
                           "to find them before training)") from error


def _datasets(cfg: TrainConfig, layout: Layout) -> tuple[ImageFolder, ImageFolder]:
    from torchvision import transforms

    size = cfg.data.image_size
    steps = [transforms.Resize((size, size))] if size else []
    transform = transforms.Compose(steps + [transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    folder = _known_classes_folder()
    try:
        train = folder(layout.train, layout.classes, transform=transform)
        test = folder(layout.test, layout.classes, transform=transform, allow_empty=True)
    except FileNotFoundError as error:  # the folders changed since check()
        raise UsageError(f"imagefolder: {error}; expected {layout.train.parent}/{LAYOUT}") from error
    return train, test


def build(cfg: TrainConfig) -> DataBundle:
    layout = scan(cfg)
    train, test = _datasets(cfg, layout)
    return DataBundle(
        name="imagefolder",
        train=FolderSplit(train, augment=cfg.data.augment),
        test=FolderSplit(test),
        num_classes=len(layout.classes),
        input_shape=layout.shape,
    )
