"""parascale: data-parallel PyTorch training on many devices, and scaling studies you can trust.

``parascale.train(config)`` runs one training job and returns its run record; it is imported
lazily so that ``import parascale`` (and ``parascale --help``) stays fast.
"""
from parascale.record import VERSION as __version__  # noqa: F401 - the package's version


def __getattr__(name: str):
    if name == "train":
        from parascale.training import train

        return train
    raise AttributeError(f"module 'parascale' has no attribute {name!r}")
