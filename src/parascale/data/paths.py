"""Checks of the user's --data-dir shared by the datasets that read files."""
from __future__ import annotations

from pathlib import Path

from parascale.config import TrainConfig
from parascale.errors import UsageError


def data_dir(cfg: TrainConfig, expected: str) -> Path:
    """The dataset folder, or a UsageError saying what `cfg.data.dataset` expects to find in it.

    `expected` describes the folder's contents, e.g. "cifar-10-batches-py/". With --download
    the folder may be missing (torchvision creates it), but it must still be given.
    """
    name = cfg.data.dataset
    if not cfg.data.data_dir:
        hint = "" if name == "imagefolder" else " (add --download to fetch it there)"
        raise UsageError(f"{name} needs --data-dir: a folder holding {expected}{hint}")
    root = Path(cfg.data.data_dir).expanduser()
    if root.exists() and not root.is_dir():
        raise UsageError(f"{name}: --data-dir {root} is a file, not a folder holding {expected}")
    if not root.exists() and not cfg.data.download:
        hint = "" if name == "imagefolder" else " (or pass --download to fetch it there)"
        raise UsageError(f"{name}: --data-dir {root} does not exist; expected a folder holding "
                         f"{expected}{hint}")
    return root


def first_line(error: BaseException) -> str:
    """An exception's message on one line (torchvision's download errors span several)."""
    text = str(error).strip().splitlines()
    return text[0] if text else f"malformed data ({type(error).__name__})"
