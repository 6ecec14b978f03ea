"""parascale: data-parallel PyTorch training on many devices, and scaling studies you can trust.

``parascale.train(config)`` runs one training job and returns its run record; it and
``__version__`` are imported lazily, so that ``import parascale`` costs nothing: the command
line starts the fork server first thing (``cli.main``), and what it imports before that delays
every run.
"""


def __getattr__(name: str):
    if name == "train":
        from parascale.training import train

        return train
    if name == "__version__":  # the package's version
        from parascale.record import VERSION

        return VERSION
    raise AttributeError(f"module 'parascale' has no attribute {name!r}")
