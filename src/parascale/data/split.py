"""Dataset splits behind one interface: `Split.batches(index_batches, device, ...)`.

The trainer decides which samples go in which batch (sharding, shuffling, accumulation); a split
only turns lists of sample indices into normalised tensors on a device. Two kinds exist:

- `TensorSplit`: every sample in one in-memory tensor; a batch is one `index_select` plus a few
  whole-batch tensor ops, so the per-sample Python cost is zero (a benchmark compares the trainer
  with a hand-written loop, and any per-sample work here would show up as trainer overhead).
- `FolderSplit` (in `parascale.data.folder`): files decoded per sample by a DataLoader.

Augmentation is one batch-level function shared by both, so its randomness comes from the
trainer's generator alone whatever the split kind or the number of DataLoader workers.
"""
from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from parascale import lazy

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # the datasets' modules define their splits here and check input without torch
    torch = lazy.module("torch", globals())
    F = lazy.module("torch.nn.functional", globals(), "F")

IndexBatches = Sequence[Union[Sequence[int], "torch.Tensor"]]
Batch = tuple["torch.Tensor", "torch.Tensor"]

PAD = 4
"""Zero padding of the random crop, in pixels (the CIFAR recipe of He et al.)."""


class Split(abc.ABC):
    """One split (train or test) of a dataset."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of samples; valid indices are range(len(self))."""

    @abc.abstractmethod
    def batches(self, index_batches: IndexBatches, device: torch.device, *, train: bool,
                generator: torch.Generator | None = None, loader_workers: int = 0,
                ) -> Iterator[Batch]:
        """Iterator of (x, y): x float32 (B, C, H, W) normalised, on `device`; y int64 (B,) on device.

        Yields exactly one batch per element of `index_batches`, in that order, each holding
        exactly those sample indices in that order. `train=True` applies augmentation when the
        dataset was built with it, drawing randomness only from `generator` (a CPU generator;
        None falls back to torch's global generator, which is not reproducible per rank).
        `loader_workers` only matters for splits read from files.
        """


@dataclass
class DataBundle:
    """What `parascale.data.build` returns: the splits and the facts a model needs."""

    name: str
    train: Split
    test: Split
    num_classes: int
    input_shape: tuple[int, ...]
    """(C, H, W) of the batches, i.e. after resizing by image_size; (T,) of token sequences."""
    val: Split | None = None
    """Held out of the training set (``--val-fraction``), or None."""


class Subset(Split):
    """Some samples of another split, by index: a validation split held out of a training set
    of any kind (in memory or files), which batches exactly as the split it came from."""

    def __init__(self, split: Split, indices: torch.Tensor):
        self.split, self.indices = split, indices

    def __len__(self) -> int:
        return len(self.indices)

    def batches(self, index_batches: IndexBatches, device: torch.device, *, train: bool,
                generator: torch.Generator | None = None, loader_workers: int = 0,
                ) -> Iterator[Batch]:
        mapped = [self.indices[as_index(b)] for b in index_batches]
        return self.split.batches(mapped, device, train=train, generator=generator,
                                  loader_workers=loader_workers)


VAL_SALT = 0x7A11D
"""Added to the seed that draws the validation samples, apart from the data order's stream."""


def held_out(n: int, fraction: float) -> int:
    """How many of ``n`` training samples a validation ``fraction`` holds out (at least one)."""
    return max(1, round(fraction * n)) if fraction else 0


def hold_out(bundle: DataBundle, fraction: float, seed: int) -> DataBundle:
    """``bundle`` with ``fraction`` of its training samples moved to a validation split, drawn by
    ``seed``: the same samples on every rank and in every run with that seed."""
    if not fraction:
        return bundle
    n = len(bundle.train)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + VAL_SALT))
    held = held_out(n, fraction)
    return dataclasses.replace(bundle, train=Subset(bundle.train, order[held:].sort().values),
                               val=Subset(bundle.train, order[:held].sort().values))


def augment(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Per sample: random crop after `PAD`-pixel zero padding, then horizontal flip with p=0.5.

    The draws happen on the CPU (so the same generator seed gives the same batch on any
    device) and are applied as one gather over the whole batch. Padding is zero in the
    normalised tensor, i.e. the dataset's mean colour, since augmentation runs after Normalize.
    """
    b, c, h, w = x.shape
    offsets = torch.randint(0, 2 * PAD + 1, (b, 2), generator=generator).to(x.device)
    flip = (torch.rand(b, generator=generator) < 0.5).to(x.device)
    hp, wp = h + 2 * PAD, w + 2 * PAD
    cols = torch.arange(w, device=x.device)
    rows = offsets[:, :1] + torch.arange(h, device=x.device)               # (b, h)
    cols = offsets[:, 1:] + torch.where(flip[:, None], cols.flip(0), cols)  # (b, w)
    flat = (rows[:, :, None] * wp + cols[:, None, :]).reshape(b, 1, h * w).expand(b, c, h * w)
    padded = F.pad(x, (PAD, PAD, PAD, PAD)).reshape(b, c, hp * wp)
    return padded.gather(2, flat).reshape(b, c, h, w)


NORMALISED_BYTES = 64 * 2**20  # digits: 0.4 MB; CIFAR-10's 50,000 images would be 600 MB


def resize(x: torch.Tensor, size: int | None) -> torch.Tensor:
    """Bilinear resize of a batch to size x size (no-op when size is None or already right)."""
    if size is None or x.shape[-2:] == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", antialias=False,
                         align_corners=False)


def on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``. Onto a GPU through pinned memory: that copy is queued behind the
    device's work and the host goes on, where a copy from pageable memory makes the host wait
    for the device (a synchronisation in every step, which a GPU's plain loop avoids so)."""
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def as_index(batch: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """One index batch as an int64 CPU tensor."""
    return torch.as_tensor(batch, dtype=torch.long, device="cpu").reshape(-1)


class TensorSplit(Split):
    """All samples in memory: `x` (N, C, H, W) uint8 or float32, `y` (N,) int64.

    Pixel values are `x * scale` (1/255 for uint8 images, 1 for data already in [0, 1]) and are
    then normalised with per-channel `mean` and `std`.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, mean: Sequence[float],
                 std: Sequence[float], *, scale: float = 1.0, image_size: int | None = None,
                 augment: bool = False):
        if x.ndim != 4 or len(x) != len(y):
            raise ValueError(f"need x (N, C, H, W) and y (N,), "
                             f"got {tuple(x.shape)} and {tuple(y.shape)}")
        if len(mean) != x.shape[1] or len(std) != x.shape[1]:
            raise ValueError(f"mean/std need {x.shape[1]} channels, got {len(mean)}/{len(std)}")
        self.x, self.y = x, y.to(torch.long)
        self.image_size, self.augment = image_size, augment
        self.mean, self.std, self.scale = list(mean), list(std), scale
        # Fold scaling and normalisation into one multiply-add: (x*scale - mean)/std = x*a + b.
        std_t = torch.tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
        mean_t = torch.tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
        self._a, self._b = scale / std_t, -mean_t / std_t
        self._identity = bool((self._a == 1).all() and (self._b == 0).all())
        self._affine: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._ready: torch.Tensor | None = None  # see _normalised

    def __len__(self) -> int:
        return len(self.y)

    def state(self) -> dict:
        """What rebuilds this split (tensors and plain values, for ``torch.save``)."""
        return {"x": self.x, "y": self.y, "mean": self.mean, "std": self.std,
                "scale": self.scale, "image_size": self.image_size, "augment": self.augment}

    @classmethod
    def from_state(cls, state: dict) -> TensorSplit:
        return cls(state["x"], state["y"], state["mean"], state["std"], scale=state["scale"],
                   image_size=state["image_size"], augment=state["augment"])

    def _coefficients(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._affine:
            self._affine[device] = (self._a.to(device), self._b.to(device))
        return self._affine[device]

    def _normalised(self, device: torch.device) -> torch.Tensor | None:
        """Every sample as float32, normalised, when that is cheap to keep: on the CPU (no
        transfer to save) and up to NORMALISED_BYTES. The same multiply and add as a batch's,
        element by element, so the same values to the bit; a batch then takes two copies
        where it took six operations, a visible share of a small model's step."""
        if device.type != "cpu" or self.x.numel() * 4 > NORMALISED_BYTES:
            return None
        if self._ready is None:
            x = self.x.to(torch.float32, copy=True)
            if not self._identity:
                a, b = self._coefficients(device)
                x = x.mul_(a).add_(b)
            self._ready = x
        return self._ready

    def batches(self, index_batches: IndexBatches, device: torch.device, *, train: bool,
                generator: torch.Generator | None = None, loader_workers: int = 0,
                ) -> Iterator[Batch]:
        device = torch.device(device)
        ready = self._normalised(device)
        for batch in index_batches:
            idx = as_index(batch)
            if ready is not None:  # a small split on the CPU: normalised once, not per batch
                x = resize(ready.index_select(0, idx), self.image_size)
                y = self.y.index_select(0, idx)
                yield (augment(x, generator) if train and self.augment else x), y
                continue
            # Move the raw (often uint8, 4x smaller) samples first: on a GPU the conversion,
            # resize and augmentation then run there; on the CPU the order makes no difference.
            x = on_device(self.x.index_select(0, idx), device)
            y = on_device(self.y.index_select(0, idx), device)
            x = x.to(torch.float32)  # index_select made a copy, so in-place ops below are safe
            if not self._identity:
                a, b = self._coefficients(x.device)
                x = x.mul_(a).add_(b)
            x = resize(x, self.image_size)
            if train and self.augment:
                x = augment(x, generator)
            yield x, y
