"""Small data sets in their real on-disk formats, for the tests that read them (not a test
module: tests import from here, never from each other)."""
from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

CIFAR_TRAIN_PER_BATCH = 2
CIFAR_TEST = 3


# --- CIFAR-10 pickles ----------------------------------------------------------------------------

class Py2Str(bytes):
    """A Python 2 `str`. The real CIFAR files are Python 2 pickles, so their keys load as str
    under torchvision's encoding="latin1" and as bytes (b"data") under encoding="bytes"."""


class Py2Pickler(pickle._Pickler):  # the pure-Python pickler, whose dispatch table we can extend
    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2str(self, obj: Py2Str) -> None:
        raw = bytes(obj)
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[Py2Str] = save_py2str


def write_py2_pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        Py2Pickler(f, protocol=2).dump(obj)


def cifar_batch(rng: np.random.Generator, n: int, name: str) -> dict:
    return {
        Py2Str(b"batch_label"): Py2Str(name.encode()),
        Py2Str(b"labels"): [int(v) for v in rng.integers(0, 10, n)],
        # rows of 3072 bytes: the 1024 red, then green, then blue pixels, each plane row-major
        Py2Str(b"data"): rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        Py2Str(b"filenames"): [Py2Str(f"img_{i}.png".encode()) for i in range(n)],
    }


def write_cifar(root: Path) -> dict[str, dict]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    batches = {f"data_batch_{i}": cifar_batch(rng, CIFAR_TRAIN_PER_BATCH, f"training batch {i} of 5")
               for i in range(1, 6)}
    batches["test_batch"] = cifar_batch(rng, CIFAR_TEST, "testing batch 1 of 1")
    for name, batch in batches.items():
        write_py2_pickle(folder / name, batch)
    write_py2_pickle(folder / "batches.meta", {
        Py2Str(b"num_cases_per_batch"): 10000, Py2Str(b"num_vis"): 3072,
        Py2Str(b"label_names"): [Py2Str(n.encode()) for n in (
            "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")],
    })
    return batches
