"""Deliberate faults, so that failure handling is tested on real processes, not on mocks.

``PARASCALE_FAULT`` holds comma-separated faults; steps count optimizer steps from 1:

- ``kill@R:S``  rank R kills itself with SIGKILL before step S (a worker that dies);
- ``raise@R:S`` rank R raises RuntimeError before step S (a worker that crashes);
- ``hang@R:S``  rank R sleeps forever before step S (a worker that is stuck);
- ``slow@R:T``  rank R sleeps T seconds before every step (a straggler);
- ``oom@B``     every rank raises out-of-memory at its first step when the per-device batch is at
  least B (an out-of-memory error at the trainer boundary, for studies on machines without GPUs).

The variable is read once per run; with none set this module costs one dictionary lookup a step.
"""
from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

import torch

from parascale.errors import UsageError

ENV = "PARASCALE_FAULT"
_FORM = re.compile(r"(kill|raise|hang|slow)@(\d+):(\d+(?:\.\d+)?)|oom@(\d+)")


@dataclass(frozen=True)
class Faults:
    """The faults that apply to one rank; ``before_step`` is called by the loop every step."""

    rank: int
    kill_at: int | None = None
    raise_at: int | None = None
    hang_at: int | None = None
    slow_s: float = 0.0
    oom_batch: int | None = None

    @classmethod
    def from_env(cls, rank: int) -> Faults:
        text = os.environ.get(ENV, "").strip()
        if not text:
            return cls(rank)
        found: dict = {}
        for item in text.split(","):
            match = _FORM.fullmatch(item.strip())
            if not match:
                raise UsageError(f"{ENV}={text!r}: cannot read {item!r}; use kill@R:S, raise@R:S, "
                                 "hang@R:S, slow@R:SECONDS or oom@BATCH")
            kind, who, when, oom = match.groups()
            if oom:
                found["oom_batch"] = int(oom)
            elif int(who) == rank:
                if kind == "slow":
                    found["slow_s"] = float(when)
                else:
                    found[f"{kind}_at"] = int(float(when))
        return cls(rank, **found)

    def before_step(self, step: int, per_device_batch: int) -> None:
        if self.slow_s:
            time.sleep(self.slow_s)
        if self.oom_batch is not None and per_device_batch >= self.oom_batch:
            raise torch.OutOfMemoryError(
                f"injected out-of-memory: per-device batch {per_device_batch} >= {self.oom_batch}")
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == self.raise_at:
            raise RuntimeError(f"injected fault on rank {self.rank} at step {step}")
        if step == self.hang_at:
            while True:
                time.sleep(3600)
