"""The rendezvous store a job's ranks meet through, listening only where it must.

The local launcher hosts one for its workers, and rank 0 of an srun world hosts one on
MASTER_ADDR (:mod:`.world`); both bind the socket here, so that nothing of a job listens on an
interface its peers do not use.
"""
from __future__ import annotations

import datetime
import errno
import socket
from typing import TYPE_CHECKING

from parascale.errors import UsageError

if TYPE_CHECKING:
    import torch.distributed as dist

LOOPBACK = "127.0.0.1"


def _listen(host: str, port: int) -> socket.socket:
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def open_store(port: int | None = None, host: str = LOOPBACK,
               timeout_s: float = 60.0) -> dist.TCPStore:
    """Host a TCPStore that listens on ``host`` alone: loopback unless a multi-node world names
    its address. ``port`` None lets the operating system choose; a busy one is a UsageError.

    torch's own server listens on every interface whatever ``host`` says, so the socket is bound
    here and handed over (``master_listen_fd``). A host that is not an address of this machine
    (a torchrun world whose rank 0 is not on MASTER_ADDR) is replaced by this machine's address
    on the route towards it, the one interface its peers reach: the store's ``host`` says which.
    """
    try:
        try:
            sock = _listen(host, port or 0)
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL or host == LOOPBACK:
                raise
            host = address_towards(host)
            sock = _listen(host, port or 0)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE and port:
            raise UsageError(f"--port {port} is already in use on {host}; choose another "
                             "port or leave --port out to let parascale pick a free one") from None
        else:
            raise UsageError(f"cannot listen on {host}:{port or 0}: "
                             f"{exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    import torch.distributed as dist  # here: the world module is read without torch

    return dist.TCPStore(host, bound, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s),
                         master_listen_fd=sock.detach())  # the store closes it


def address_towards(host: str) -> str:
    """This machine's address on the route to ``host``: connecting a UDP socket sends nothing,
    but makes the kernel choose the interface and its source address."""
    family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(address)
        return probe.getsockname()[0]
