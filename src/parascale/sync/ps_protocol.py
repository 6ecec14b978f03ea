"""What parameter-server workers and servers agree on: the messages, the shard spec, the update.

Workers are ranks 0..N-1 of a gloo group of their own, servers N..N+K-1. Every tensor is on the
CPU; tags tell the messages apart:

- worker -> server, ``HEADER`` (float64[7]): kind (PUSH, PULL or STOP), the shard version the
  worker last pulled, then lr, momentum, dampening, weight decay, nesterov. The optimizer
  settings travel with every push, so the server applies what the worker's learning-rate
  schedule says for that step.
- worker -> server, ``GRAD``: the worker's shard of the gradient, after a PUSH header,
  compressed by ``Spec.compression`` (elementwise: the shard of the compressed vector).
- server -> worker, ``REPLY`` (float64[1]): the shard's version after the request, then
  ``PARAMS``: the shard itself. STOP gets no reply.
- worker 0 -> server, ``INIT``: the initial shard, once, before anything else.

Checkpoints (the servers hold the parameters and the momentum, so a checkpoint must ask them):

- ``SNAPSHOT``: worker 0 gets ``STATE`` (float64[2]: the shard's version, whether a momentum
  buffer follows), then ``PARAMS`` and, if there is one, ``MOMENTUM``. In sync mode every
  worker sends the header (a round is one kind); only worker 0 gets the reply.
- ``RESTORE``: worker 0 sends ``PARAMS`` and, if header[2] says so, ``MOMENTUM``; header[1] is
  the version to go on from. The server answers ``STATE`` to worker 0 once it holds them. In
  sync mode every worker sends the header, in async mode worker 0 alone (before any push).
"""
from __future__ import annotations

import json
import os
import datetime
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol, cast

from parascale import lazy, safejson
from parascale.runtime import contract

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
else:  # the strategies' registry imports this module without torch
    torch = lazy.module("torch", globals())
    dist = lazy.module("torch.distributed", globals(), "dist")

ENV = contract.PS_SERVER
PREFIX = "parascale-ps/"
HEADER, GRAD, REPLY, PARAMS, INIT, MOMENTUM, STATE = range(7)
PUSH, PULL, STOP, SNAPSHOT, RESTORE = 1, 2, 3, 4, 5
CHECKPOINT_KINDS = (SNAPSHOT, RESTORE)
HEADER_SIZE = 7


@dataclass
class Spec:
    """What one server needs to know; passed to it as JSON in the environment."""

    host: str
    port: int
    index: int  # k in 0..K-1; its rank in the group is workers + index
    workers: int
    servers: int
    start: int  # the shard is [start, stop) of the flat parameter vector
    stop: int
    mode: str  # sync | async
    timeout_s: float
    parent_pid: int
    dtype: str
    compression: str = "none"  # of the gradients the workers push (sync/compression.py)

    def to_env(self) -> str:
        return safejson.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> Spec:
        return cls(**json.loads(os.environ[ENV]))


def sgd_update(param: torch.Tensor, grad: torch.Tensor, state: dict, lr: float,
               momentum: float, dampening: float, weight_decay: float, nesterov: bool) -> None:
    """torch.optim.SGD's single-tensor update, in the same order of operations."""
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    if momentum != 0:
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = grad.detach().clone()
        else:
            buf.mul_(momentum).add_(grad, alpha=1 - dampening)
        grad = grad.add(buf, alpha=momentum) if nesterov else buf
    param.add_(grad, alpha=-lr)


class Shard:
    """A server's piece of the model: parameters, momentum buffer, and updates applied so far."""

    def __init__(self, param: torch.Tensor):
        self.param = param
        self.state: dict = {}
        self.version = 0

    def checkpoint(self, pg, kind: int, header: torch.Tensor) -> None:
        """Answer worker 0's SNAPSHOT or RESTORE (module docstring); the caller holds any lock."""
        state = torch.zeros(2, dtype=torch.float64)
        if kind == SNAPSHOT:
            momentum = self.state.get("momentum_buffer")
            state[0], state[1] = self.version, momentum is not None
            works = [pg.send([state], 0, STATE), pg.send([self.param], 0, PARAMS)]
            if momentum is not None:
                works.append(pg.send([momentum], 0, MOMENTUM))
        else:
            received = [pg.recv([self.param], 0, PARAMS)]
            if header[2]:
                momentum = self.state.setdefault("momentum_buffer", torch.empty_like(self.param))
                received.append(pg.recv([momentum], 0, MOMENTUM))
            else:
                self.state.pop("momentum_buffer", None)
            for work in received:
                work.wait()
            self.version = int(header[1])
            state[0], state[1] = self.version, bool(header[2])
            works = [pg.send([state], 0, STATE)]
        for work in works:
            work.wait()

    def apply(self, grad: torch.Tensor, header: torch.Tensor) -> None:
        _, _, lr, momentum, dampening, weight_decay, nesterov = header.tolist()
        sgd_update(self.param, grad, self.state, lr, momentum, dampening, weight_decay,
                   bool(nesterov))
        self.version += 1


class Waitable(Protocol):
    def wait(self) -> bool: ...


class Group(Protocol):
    """What workers and servers use of their gloo group: point-to-point messages with a tag, and
    a barrier. torch's type stubs leave these methods out of ``ProcessGroup``; they exist."""

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Waitable: ...

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Waitable: ...

    def barrier(self) -> Waitable: ...


def open_group(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> Group:
    """The gloo group of the workers and servers, over ``store`` (under :data:`PREFIX`)."""
    return cast(Group, dist.ProcessGroupGloo(dist.PrefixStore(PREFIX, store), rank, size,
                                             timeout))
