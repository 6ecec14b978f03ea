"""A data set built once by the launching process and handed to its workers as a tensor file.

The launcher builds the data anyway, to check it before any worker starts. Instead of every
worker building it again (digits needs scikit-learn, 1.5 s to import; CIFAR and MNIST need
torchvision, 3.5 s, and a parse of their files; the Shakespeare corpus is 78 files to read and
encode), the launcher saves the in-memory splits (images and labels, or a token stream) with
``torch.save`` and each worker maps the file (``torch.load(mmap=True)``): the workers share one
copy in the page cache. A study keeps the file for all its configurations with that data.

The file is an optimisation, never a second source of truth: it records the key of the data
it holds (the configuration's data fields and a stamp of its source files), and a worker whose
configuration does not match it, or which finds no file, builds the data itself, as it does
under torchrun or srun. Data read from image folders, sample by sample, is not handed over.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.config import TrainConfig
from parascale.data.split import DataBundle, TensorSplit
from parascale.data.text import TokenSplit
from parascale.runtime import contract

if TYPE_CHECKING:
    import torch
else:  # the registry's checks run without torch; building and handing over need it
    torch = lazy.module("torch", globals())

ENV = contract.DATA_FILE  # set by the launcher for its workers
_FOLDER_PREFIX = "parascale-data-"

#: The TrainConfig fields a data set is built from (every loader reads only these): configurations
#: that agree on them have the same data, which a study then builds once to check them all.
FIELDS = ("dataset", "data_dir", "download", "image_size", "augment", "seed", "num_classes",
          "synthetic_shape", "synthetic_size", "verify_data", "val_fraction", "context")

#: the in-memory splits a file can hold, by the name the file gives their kind: images and
#: labels, and a text's token stream
_KINDS: dict[str, type[TensorSplit] | type[TokenSplit]] = {"tensors": TensorSplit,
                                                           "tokens": TokenSplit}
#: data key -> (file or None, facts); this process's data sets, built once each
_PREPARED: dict[str, tuple[Path | None, dict[str, Any]]] = {}
_folder: Path | None = None


def key(cfg: TrainConfig, loader) -> str | None:
    """What identifies ``cfg``'s data: its data fields and the loader's stamp of its source
    (files' sizes and times); None when the loader gives no stamp (nothing is kept)."""
    stamp = getattr(loader, "stamp", None)
    if stamp is None:
        return None
    return json.dumps([*(cfg.value(name) for name in FIELDS), stamp(cfg)], default=str)


def prepare(cfg: TrainConfig, loader, keep: bool) -> dict[str, Any]:
    """Build ``cfg``'s data (once per key in this process) and return its facts: sizes of the
    splits, classes, input shape. With ``keep``, in-memory data is saved for the workers."""
    k = key(cfg, loader)
    if k is not None and k in _PREPARED and (_PREPARED[k][0] or not keep):
        return _PREPARED[k][1]
    bundle = loader.build(cfg)
    facts = {"train": len(bundle.train), "test": len(bundle.test),
             "num_classes": bundle.num_classes, "input_shape": tuple(bundle.input_shape)}
    path = _save(bundle, k) if keep and k is not None else None
    if k is not None:
        _PREPARED[k] = (path, facts)
    return facts


def file_for(cfg: TrainConfig, loader) -> Path | None:
    """The file ``prepare`` saved for ``cfg``'s data, if any (for the workers' environment)."""
    k = key(cfg, loader)
    return _PREPARED[k][0] if k is not None and k in _PREPARED else None


def take(cfg: TrainConfig, loader) -> DataBundle | None:
    """In a worker: the data its launcher handed over, or None if there is none for ``cfg``."""
    path = os.environ.get(ENV)
    if not path or not Path(path).is_file():
        return None
    k = key(cfg, loader)
    blob = torch.load(path, mmap=True, weights_only=True)
    if k is None or blob["key"] != k:
        return None
    kind = _KINDS[blob["kind"]]
    return DataBundle(name=blob["name"], train=kind.from_state(blob["train"]),
                      test=kind.from_state(blob["test"]),
                      num_classes=blob["num_classes"], input_shape=tuple(blob["input_shape"]))


def _save(bundle: DataBundle, k: str) -> Path | None:
    train, test = bundle.train, bundle.test
    kept = tuple(_KINDS.values())
    if not (isinstance(train, kept) and isinstance(test, kept) and type(train) is type(test)):
        return None
    kind = next(name for name, split in _KINDS.items() if type(train) is split)
    path = _own_folder() / f"data-{len(_PREPARED)}.pt"
    partial = path.with_suffix(".tmp")
    torch.save({"key": k, "kind": kind, "name": bundle.name, "train": train.state(),
                "test": test.state(), "num_classes": bundle.num_classes,
                "input_shape": list(bundle.input_shape)}, partial)
    os.replace(partial, path)  # a worker never maps half a file
    return path


def _own_folder() -> Path:
    """This process's folder for data files, removed when it exits (also through
    ``runtime.processes.exit_now``); an orphan is swept by the next launch."""
    global _folder
    if _folder is None:
        from multiprocessing import util

        from parascale.runtime.scratch import make_dir

        _folder = make_dir(_FOLDER_PREFIX)
        util.Finalize(None, shutil.rmtree, args=(str(_folder),),
                      kwargs={"ignore_errors": True}, exitpriority=-50)
    return _folder
