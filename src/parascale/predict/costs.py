"""Time of one step's exchange, per strategy, in the α-β model (sources below, per formula).

S is the gradient (or parameter) bytes that enter the exchange, n the workers, α the latency
per message and β seconds per byte of the link. Each function returns seconds for *one
exchange*; a strategy that exchanges every H steps is amortised by :func:`per_step`.

- ring allreduce: ``2(n−1)α + 2((n−1)/n)·S·β`` (reduce-scatter then all-gather; Thakur,
  Rabenseifner and Gropp 2005). DDP sends S in buckets, each its own allreduce, so the latency
  term is paid once per bucket.
- tree (reduce then broadcast along a binary tree): ``2·⌈log2 n⌉·(α + S·β)``.
- root: reduced through one root, then broadcast (Dive into Deep Learning): the root receives n−1 gradients
  and sends n−1 means, one after another: ``2(n−1)·(α + S·β)``.
- server: k parameter servers (BytePS, Jiang et al. 2020): a push, then a pull, each bounded
  by the busier end, a worker (S) or a server (n·S/k): ``2·(α + max(S, n·S/k)·β)``.
- hierarchical ring on nodes of G devices: reduce-scatter inside each node (intra link), ring
  allreduce of S/G across the m nodes (inter link), all-gather inside the node:
  ``2(G−1)α_i + 2((G−1)/G)·S·β_i + 2(m−1)α_e + 2((m−1)/m)·(S/G)·β_e``. One node is the flat ring
  on the intra link; one device per node the flat ring on the inter link.

Sharded strategies (Rajbhandari et al. 2020; docs/predict.md) move the same ring passes, each
``(n−1)α + ((n−1)/n)·S·β``: ZeRO stage 1 as torch runs it, DDP's allreduce (2 passes, hidden
behind backward like allreduce's) and then each rank's updated parameters broadcast to the
others (1 pass, after backward); FSDP stage 2 an all-gather of the parameters in forward and a
reduce-scatter of the gradients in backward (2 passes, allreduce's bytes); stage 3 gathers the
parameters again in backward (3 passes, 1.5x stage 2).

With n = 1 every exchange costs 0: one device training alone has nothing to exchange, which is
the reference every speedup is measured against.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from parascale import sync
from parascale.errors import UsageError
from parascale.predict.interconnect import Link
from parascale.sync import Pattern


def ring(n: int, size: float, link: Link, messages: int = 1) -> float:
    if n <= 1:
        return 0.0
    return messages * 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * size * link.beta_s_per_byte


def tree(n: int, size: float, link: Link, messages: int = 1) -> float:
    if n <= 1:
        return 0.0
    depth = math.ceil(math.log2(n))
    return 2 * depth * (messages * link.alpha_s + size * link.beta_s_per_byte)


def reduce_broadcast(n: int, size: float, link: Link) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * (link.alpha_s + size * link.beta_s_per_byte)


def parameter_server(n: int, size: float, link: Link, servers: int = 1) -> float:
    if n <= 1:
        return 0.0
    busiest = max(size, n * size / servers)
    return 2 * (link.alpha_s + busiest * link.beta_s_per_byte)


def hierarchical_ring(n: int, size: float, intra: Link, inter: Link, per_node: int,
                      messages: int = 1) -> float:
    """Ring inside each node, ring across nodes on S/G; ``per_node`` = G devices per node."""
    if n <= 1:
        return 0.0
    g = min(n, per_node)
    nodes = math.ceil(n / g)
    inside = ring(g, size, intra, messages)  # reduce-scatter + all-gather: the same terms
    across = ring(nodes, size / g, inter, messages)
    return inside + across


@dataclass(frozen=True)
class Strategy:
    """What the model needs to know of a ``--sync`` strategy."""

    name: str
    overlaps: bool
    """Communication can hide behind backward (DDP's buckets); else it follows backward."""
    every: int = 1
    """Steps per exchange (local SGD's and SMA's period); the cost is divided by it."""
    servers: int = 1
    """Parameter servers (the server algorithm only)."""
    algorithm: str = "ring"
    """ring | tree | root | server: the collective pattern (sync.traits.Pattern)."""
    passes: float = 2.0
    """Ring passes of ((n−1)/n)·S per exchange: 2 for an allreduce (reduce-scatter, all-gather),
    3 for FSDP stage 3, 3 for torch's ZeRO-1 (its broadcast of the updated parameters)."""
    after: float = 0.0
    """Of ``passes``, those that follow the update and never hide (ZeRO-1's broadcast)."""
    stage: int | None = None
    """The ZeRO stage of a sharded strategy (1, 2 or 3)."""
    in_compute: bool = False
    """The exchange runs inside forward and backward, which records count as compute."""

    @classmethod
    def of(cls, name: str, pattern: Pattern) -> Strategy:
        """Strategy ``name`` as its declared ``pattern`` (``Strategy.pattern``) describes it."""
        return cls(name, **dataclasses.asdict(pattern))

    @property
    def hideable(self) -> float:
        """The share of the exchange that may hide behind backward."""
        return (self.passes - self.after) / self.passes if self.overlaps else 0.0

    def describe(self) -> str:
        text = {"ring": "ring allreduce", "tree": "tree reduce + broadcast",
                "root": "reduce to one root + broadcast",
                "server": f"parameter server, {self.servers} server(s)"}[self.algorithm]
        if self.stage is not None:
            text = (f"ZeRO stage {self.stage}, " + {
                1: "DDP's ring allreduce then a broadcast of the updated parameters",
                2: "all-gather in forward, reduce-scatter in backward",
                3: "all-gather in forward and again in backward, reduce-scatter"}[self.stage]
                + f": {self.passes:g} ring passes of the bytes")
        if self.every > 1:
            text += f", once every {self.every} steps"
        text += ", after backward" if not self.overlaps else \
            ", overlapped with backward" if not self.after else \
            f" ({self.passes - self.after:g} overlapped with backward)"
        return f"{self.name} ({text})"


#: beside the registry's strategies: DDP-like overlap with a tree instead of a ring, as NCCL
#: chooses for small messages on many nodes (no strategy runs it; predict models it)
TREE = Strategy("tree", overlaps=True, algorithm="tree")


def names() -> list[str]:
    """What predict models: the registry's strategies that declare a pattern, and the tree."""
    return [*sync.with_pattern(), TREE.name]


def strategy(name: str, settings: dict | None = None, where: str = "--sync-option") -> Strategy:
    """Strategy ``name`` with its options ``settings`` (unnamed ones at their defaults), as its
    declared pattern describes it; one line where it declares none."""
    if name == TREE.name:
        return TREE
    pattern = sync.get(name).pattern(sync.read_settings(name, settings or {}, where))
    if pattern is None:
        raise UsageError(f"--sync {name} declares no exchange to model; predict models "
                         f"{', '.join(names())}")
    return Strategy.of(name, pattern)


def exchange_time(s: Strategy, n: int, size: float, link: Link, *, buckets: int = 1,
                  intra: Link | None = None, per_node: int | None = None) -> float:
    """Seconds of one exchange of ``size`` bytes on n workers (not yet amortised).

    With ``per_node`` and ``intra``: rings are hierarchical; the other algorithms run at the
    speed of the slowest link they cross (the inter-node one once n exceeds a node)."""
    hierarchical = per_node is not None and intra is not None
    if s.algorithm == "ring":  # an allreduce is 2 passes; sharded strategies move s.passes
        if hierarchical:
            return hierarchical_ring(n, size, intra, link, per_node, buckets) * s.passes / 2
        return ring(n, size, link, buckets) * s.passes / 2
    if hierarchical and n <= per_node:
        link = intra
    if s.algorithm == "tree":
        return tree(n, size, link, buckets)
    if s.algorithm == "root":
        return reduce_broadcast(n, size, link)
    return parameter_server(n, size, link, s.servers)


def per_step(s: Strategy, n: int, size: float, link: Link, **kwargs) -> float:
    """Exchange time per optimizer step: one exchange amortised over the strategy's period."""
    return exchange_time(s, n, size, link, **kwargs) / s.every
