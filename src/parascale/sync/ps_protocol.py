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
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch

ENV = "PARASCALE_PS_SERVER"
PREFIX = "parascale-ps/"
HEADER, GRAD, REPLY, PARAMS, INIT = range(5)
PUSH, PULL, STOP = 1, 2, 3
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
        return json.dumps(asdict(self))

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

    def apply(self, grad: torch.Tensor, header: torch.Tensor) -> None:
        _, _, lr, momentum, dampening, weight_decay, nesterov = header.tolist()
        sgd_update(self.param, grad, self.state, lr, momentum, dampening, weight_decay,
                   bool(nesterov))
        self.version += 1
