"""Deliberate faults, so that failure handling is tested on real processes, not on mocks.

``PARASCALE_FAULT`` holds comma-separated faults; steps count optimizer steps from 1:

- ``kill@R:S``  rank R kills itself with SIGKILL before step S (a worker that dies);
- ``raise@R:S`` rank R raises RuntimeError before step S (a worker that crashes);
- ``hang@R:S``  rank R sleeps forever before step S (a worker that is stuck);
- ``exit@R:S``  rank R calls ``os._exit(0)`` before step S (a worker that leaves early with
  status 0, as a task calling ``os._exit(0)`` does; ``sys.exit(0)`` is ``sysexit@R:S``);
- ``slow@R:T``  rank R sleeps T seconds before every step (a straggler);
- ``nan@R:S``   rank R's loss at step S is NaN, and so are its gradients (a diverging run);
- ``hog@R:S``   rank R takes memory before step S, 64 MiB at a time, until the kernel's
  out-of-memory killer ends it (run it under a memory limit: a cgroup);
- ``oom@B``     every rank raises out-of-memory at its first step when the per-device batch is at
  least B (an out-of-memory error at the trainer boundary, for studies on machines without GPUs).

Restarts (``--max-restarts``, torchrun's): an event (kill, raise, hang, exit, nan, hog) happens in the
first start of the workers only, so that a restarted job does not meet the same fault forever;
``/A`` makes it happen in attempt A instead (0 the first start, 1 after the first restart...)
and ``/*`` in every attempt (``kill@1:5/*`` exhausts any number of restarts). A condition
(``slow``, ``oom``) holds in every attempt, as the machine it describes would. The attempt is
the launcher's (``PARASCALE_ATTEMPT``) or torchrun's (``TORCHELASTIC_RESTART_COUNT``); a new
command (``--resume``) is attempt 0 again, so unset the variable before resuming a run that
a fault stopped.

The launching process checks the variable in preflight (:func:`check`), so a malformed value is
one line there rather than a traceback from every worker. Workers read it once per run; with
none set this module costs one dictionary lookup a step.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from parascale import lazy
from parascale.errors import UsageError
from parascale.runtime import contract
from parascale.runtime.env import attempt as current_attempt

if TYPE_CHECKING:
    import torch
else:  # the launcher checks PARASCALE_FAULT without torch; the events use it in a worker
    torch = lazy.module("torch", globals())

ENV = contract.FAULT
_FORM = re.compile(r"(kill|raise|hang|exit|sysexit|slow|nan|hog)@(\d+):(\d+(?:\.\d+)?)(?:/(\d+|\*))?"
                   r"|oom@(\d+)", re.ASCII)  # \d alone would take '５', which int() reads
CONDITIONS = ("slow", "oom")  # hold in every attempt; the other kinds are events
EVERY = "*"


def _items(text: str) -> list[tuple[str, int | None, float, int | str]]:
    """(kind, rank or None for every rank, step/seconds/batch, attempt or EVERY)."""
    found: list[tuple[str, int | None, float, int | str]] = []
    for item in text.split(",") if text.strip() else []:
        match = _FORM.fullmatch(item.strip())
        if not match:
            raise UsageError(f"{ENV}={text!r}: cannot read {item.strip()!r}; use kill@R:S, "
                             "raise@R:S, hang@R:S, exit@R:S, sysexit@R:S, nan@R:S, hog@R:S, slow@R:SECONDS or "
                             "oom@BATCH (R a rank, S a step from 1), comma-separated; an "
                             "event may end in /A (attempt A only) or /* (every attempt)")
        kind, who, when, attempt, oom = match.groups()
        if oom:
            found.append(("oom", None, int(oom), EVERY))
        else:
            default = EVERY if kind in CONDITIONS else 0
            found.append((kind, int(who), float(when),
                          default if attempt is None else
                          EVERY if attempt == EVERY else int(attempt)))
    return found


def parse(text: str) -> list[tuple[str, int | None, float]]:
    """The faults in ``text`` as (kind, rank or None for every rank, step/seconds/batch)."""
    return [(kind, who, value) for kind, who, value, _ in _items(text)]


def check() -> None:
    """Preflight: raise UsageError unless ``PARASCALE_FAULT`` is unset or well formed."""
    parse(os.environ.get(ENV, ""))


@dataclass(frozen=True)
class Faults:
    """The faults that apply to one rank; the loop calls ``before_step`` and ``loss`` every
    step."""

    rank: int
    kill_at: int | None = None
    raise_at: int | None = None
    hang_at: int | None = None
    exit_at: int | None = None
    sysexit_at: int | None = None
    nan_at: int | None = None
    hog_at: int | None = None
    slow_s: float = 0.0
    oom_batch: int | None = None

    @classmethod
    def from_env(cls, rank: int, attempt: int | None = None) -> Faults:
        """The faults of ``rank`` in ``attempt`` (default: this process's, see the module)."""
        attempt = current_attempt() if attempt is None else attempt
        found: dict = {}
        for kind, who, value, when in _items(os.environ.get(ENV, "")):
            if when != EVERY and when != attempt:
                continue
            if kind == "oom":
                found["oom_batch"] = int(value)
            elif who == rank:
                found["slow_s" if kind == "slow" else f"{kind}_at"] = \
                    value if kind == "slow" else int(value)
        return cls(rank, **found)

    def loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """The step's loss, made NaN at ``nan@R:S`` (the gradients follow through backward)."""
        return loss * float("nan") if step == self.nan_at else loss

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
        if step == self.exit_at:
            os._exit(0)
        if step == self.sysexit_at:
            sys.exit(0)
        if step == self.hang_at:
            while True:
                time.sleep(3600)
        if step == self.hog_at:
            held = []
            while True:  # touched, so the pages are really resident
                held.append(bytearray(b"\x01") * (64 << 20))
