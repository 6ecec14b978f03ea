"""A world of one rank in this process (gloo on loopback, as the local launcher makes it), for
the benchmarks that drive parascale's step directly rather than through ``parascale train``."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from parascale.runtime import World, joined
from parascale.runtime.local import open_store
from parascale.runtime.world import LOCAL_ENV


@contextlib.contextmanager
def world_of_one(device: str = "cpu") -> Iterator[World]:
    """One rank on ``device`` (cuda: the first GPU, over NCCL), one CPU thread."""
    store = open_store()  # loopback only; the world joins it as the local launcher's
    os.environ.update({LOCAL_ENV: str(store.port), "PARASCALE_RANK": "0",
                       "PARASCALE_WORLD_SIZE": "1", "PARASCALE_LOCAL_RANK": "0",
                       "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    torch.set_num_threads(1)
    cuda = device == "cuda"
    with joined(device, "nccl" if cuda else "gloo", (0,) if cuda else None, 60, True) as world:
        yield world
