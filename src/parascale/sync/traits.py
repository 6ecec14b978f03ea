"""What a strategy declares about itself, so that no other package spells its name.

``Strategy.traits`` holds what a strategy is whatever its options (:class:`Traits`); what
depends on its options is a class method of ``Strategy`` that takes its settings
(``lockstep``, ``agrees``, ``equivalence``: :data:`GRADIENT` or :data:`UPDATE`, ``pattern``:
:class:`Pattern`). The trainer, the script API,
find-batch, ``predict``, ``bench`` and ``report`` read them through the registry
(``parascale.sync``), which imports no torch, so that ``--help`` and ``report`` need none.
"""
from __future__ import annotations

from dataclasses import dataclass

#: what a strategy may shard across the ranks: the parameters, the gradients, the optimizer state
SHARDABLE = ("params", "grads", "state")

# How N workers with B/N samples each relate to one worker with the whole batch B
# (``Strategy.equivalence(settings)``; None: they need not end alike). The foundation test of
# data parallelism holds the strategies to it (tests/matrix_cases.py).

GRADIENT = "gradient"
"""Every step, every rank's optimizer steps on the global batch's mean gradient (or the servers'
does): N x B/N end with the parameters of 1 x B under any optimizer, up to float rounding."""
UPDATE = "update"
"""Each rank steps on its own gradient and the replicas are averaged after every step: the
same as :data:`GRADIENT` when the optimizer's update is linear in the gradient (SGD with
momentum and weight decay), not under AdamW, whose update divides by the gradient's size."""


@dataclass(frozen=True)
class Traits:
    """What a strategy is, declared on its class."""

    exchanges: bool = True
    """It exchanges anything at all between the ranks; False for the contention baseline,
    which trains the same processes with nothing exchanged (their replicas diverge)."""
    shards: frozenset[str] = frozenset()
    """Of ``SHARDABLE``: what each rank holds only its part of between steps (the memory model
    sums the parts of a measured record; issue 33 builds sharded parameters on no device)."""
    shards_checkpoint: bool = False
    """Each rank writes its own part of a checkpoint (torch.distributed.checkpoint, which
    reshards on load), so that a checkpoint also resumes on another number of workers."""
    script_refusal: str | None = None
    """Why it cannot run a user's own script (``parascale run``), or None when it can: it does
    its work in ``wrap``, ``wrap_optimizer``, ``synchronize`` and ``after_step``, which the
    script API calls around the script's own optimizer."""
    optimizer: str | None = None
    """The ``--optimizer`` it updates with, whatever is asked, or None when it steps the
    optimizer the trainer builds (a task's own included). Such a strategy has a
    ``script_refusal``: a script steps an optimizer of its own."""
    optimizer_why: str = ""
    """Why ``optimizer`` is its own, in words that follow ``--sync NAME``."""
    mean_gradient: bool = False
    """After ``synchronize`` every rank holds the global batch's mean gradient, and it shows a
    ``watch_gradients`` watcher each rank's own before the exchange: the gradient noise scale
    can be measured under it."""
    learners: bool = False
    """A device trains several model replicas (learners), each on its own ``--batch-size``
    (Crossbow's): the report's learner figures are drawn from these runs."""

    def __post_init__(self) -> None:
        # a script steps its own optimizer, which such a strategy would silently replace
        if self.optimizer is not None and self.script_refusal is None:
            raise TypeError(f"a strategy that updates with --optimizer {self.optimizer} alone "
                            "cannot run a script, which steps its own: give it a script_refusal")


@dataclass(frozen=True)
class Pattern:
    """How one step's exchange moves the bytes, for the cost model (predict/costs.py).

    S is the size of the gradient that enters the exchange, n the workers; each algorithm's
    time is in costs.py's docstring.
    """

    algorithm: str = "ring"
    """ring (allreduce passes) | tree | root (reduced to one root, then broadcast) | server
    (pushed to parameter servers and pulled back): a collective pattern, not a strategy; several
    strategies may share one."""
    overlaps: bool = False
    """Communication can hide behind backward (DDP's buckets); else it follows backward."""
    passes: float = 2.0
    """Ring passes of ((n−1)/n)·S per exchange: 2 for an allreduce (reduce-scatter, then
    all-gather), 3 for FSDP stage 3 and for torch's ZeRO-1 (its broadcast of the updated
    parameters)."""
    after: float = 0.0
    """Of ``passes``, those that follow the update and never hide (ZeRO-1's broadcast)."""
    every: int = 1
    """Steps per exchange (a period of local steps); the cost is divided by it."""
    servers: int = 1
    """Parameter servers (the server algorithm)."""
    stage: int | None = None
    """The ZeRO stage of a sharded strategy (1, 2 or 3), for the description."""
    in_compute: bool = False
    """The exchange runs inside forward and backward, which the record's phases count as
    compute: its records show no exposed sync to measure the overlap from."""

    def exchanged(self, sent: float, n: int) -> float | None:
        """S from the bytes rank 0 sent per step (``derived.bytes_per_step``) on n workers, as
        the strategies count them: ring passes of (n−1)/n·S spread over ``every`` steps, the
        root's n−1 copies of S, a parameter server's worker pushing S once."""
        if n < 2 or sent <= 0:
            return None
        if self.algorithm == "ring":
            return sent * self.every * n / (self.passes * (n - 1))
        if self.algorithm == "root":
            return sent / (n - 1)
        if self.algorithm == "server":
            return float(sent)
        return None
