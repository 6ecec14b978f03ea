"""The configurations advise searches: devices, per-device batch, accumulation, strategy,
precision.

Strategies come from the registry, by what they declare (``sync/traits.py``), so a strategy
registered tomorrow is searched without an edit here: every strategy that exchanges something
and declares a pattern for the cost model, at its defaults and at each variation of one option
that changes what the cost model or the memory model sees:

- an option with choices takes each of them (``compression``: none, fp16, bf16, powersgd);
- a whole-number option that changes the declared pattern takes a few values (a period of
  local steps, parameter servers: :data:`LADDER`);
- each ZeRO stage the strategy declares (``Strategy.stages``).

A variation the strategy refuses with the job's settings (its optimizer, its precision) is
left out with its reason. A strategy that trains several replicas per device (``learners``)
is left out: its per-device batch means something else. Whether the variant steps on the
mean gradient of the global batch (its declared ``equivalence``) is kept: the noise-scale
model of steps holds for those (``exact``); for the rest (compression, periods of local
steps) it is an assumption, and the output says so.

Batches: powers of two around the job's own per-device batch (``--batch-sizes`` to choose),
none whose global batch exceeds the training set; accumulation (A = 2, 4, ...) only at the
largest per-device batch that fits a device, where it is the only way to a larger global
batch. Devices: every count up to the workers here; on a cluster, powers of two within a
node and whole nodes beyond.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from parascale import sync
from parascale.errors import UsageError
from parascale.sync import Pattern

#: the values a whole-number option that changes the cost model's pattern is searched at,
#: beside its default
LADDER = (2, 8)
#: how far the default batches reach from the job's per-device batch: b/4 ... 8b
BATCH_FACTORS = (0.25, 0.5, 1, 2, 4, 8)
_BATCH = ("batch_size", "global_batch", "base_batch")


@dataclass(frozen=True)
class Variant:
    """A strategy with some options changed, as the cost and memory models see it."""

    name: str
    changed: tuple[tuple[str, Any], ...]
    """The options away from their defaults, as (name, value)."""
    overlaps: bool
    stage: int
    """The memory model's row: 0 replicated, 1-3 the ZeRO stages."""
    exact: bool
    """It steps on the global batch's mean gradient (or the same update): the steps model
    holds as it stands."""
    label: str
    settings: Any = field(compare=False, repr=False)
    pattern: Pattern = field(compare=False, repr=False, default_factory=Pattern)
    helpers: int = 0
    """Processes it starts beside the workers (parameter servers)."""

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.changed)


@dataclass(frozen=True)
class Candidate:
    devices: int
    per_device_batch: int
    accumulate: int
    variant: Variant
    precision: str

    @property
    def global_batch(self) -> int:
        return self.devices * self.per_device_batch * self.accumulate

    @property
    def label(self) -> str:
        acc = f" x{self.accumulate}" if self.accumulate > 1 else ""
        return f"{self.devices} x {self.per_device_batch}{acc} {self.variant.label}"


def _stage(cls: type[sync.Strategy], settings: Any) -> int:
    pattern = cls.pattern(settings)
    if pattern is not None and pattern.stage is not None:
        return int(pattern.stage)
    shards = cls.traits.shards
    return {0: 0, 1: 1, 2: 2}.get(len(shards), 3)


def _variations(cls: type[sync.Strategy]) -> list[dict[str, Any]]:
    """Settings that differ from the defaults in one option each (see the module)."""
    base = cls.Settings()
    pattern = cls.pattern(base)
    staged = {name for chosen in cls.stages().values() for name in chosen}
    found: list[dict[str, Any]] = [{}]
    for opt in cls.Settings.declared():
        if opt.only_with is not None or opt.name in staged:
            continue  # means something only beside another option's value; or a stage's
        values: Iterable[Any] = ()
        if opt.choices:
            values = [c for c in opt.choices if c != opt.default]
        elif opt.kind is int:
            values = [v for v in LADDER if v != opt.default and
                      cls.pattern(cls.Settings.of({opt.name: v})) != pattern]
        found += [{opt.name: v} for v in values]
    for chosen in cls.stages().values():
        if cls.Settings.of(chosen) != base:
            found.append(dict(chosen))
    return found


def _label(name: str, changed: dict[str, Any]) -> str:
    return " ".join([name, *(f"{k}={v}" for k, v in changed.items())])


def variants(names: Iterable[str] | None, job: dict[str, Any], notes: list[str],
             exact_only: bool = False) -> list[Variant]:
    """The strategy variants to search, each checked against the job's settings; what is
    left out, and why, goes to ``notes``. ``exact_only``: only those whose steps the model
    covers."""
    from parascale.config import TrainConfig
    from parascale.validation import validate

    chosen = list(names) if names else sync.names()
    found: list[Variant] = []
    for name in chosen:
        cls = sync.get(name)
        if not cls.traits.exchanges:
            if names:
                notes.append(f"--sync {name} exchanges nothing (the contention baseline): not "
                             "searched")
            continue
        if cls.traits.learners:
            notes.append(f"--sync {name} trains several replicas per device, whose per-device "
                         "batch means another thing: not searched")
            continue
        if cls.pattern(cls.Settings()) is None:
            notes.append(f"--sync {name} declares no exchange the cost model knows: not "
                         "searched")
            continue
        for changed in _variations(cls):
            settings = cls.Settings.of(changed)
            try:
                unbatched = {k: v for k, v in job.items() if k not in _BATCH}
                cfg = TrainConfig.from_dict({**unbatched, "sync": name, "sync_options": changed,
                                             "workers": 2})
                validate(cfg)
            except UsageError as exc:
                notes.append(f"{_label(name, changed)}: not searched ({exc})")
                continue
            pattern = cls.pattern(settings)
            if pattern is None:
                continue
            exact = cls.equivalence(settings) is not None
            if exact_only and not exact:
                continue
            found.append(Variant(name, tuple(changed.items()), pattern.overlaps,
                                 _stage(cls, settings), exact, _label(name, changed), settings,
                                 pattern, cls.helper_processes(cfg)))
    if not found:
        raise UsageError("no strategy left to search: " + "; ".join(notes[-3:]))
    return found


def batches(reference: int, given: Iterable[int] | None, limit: int) -> list[int]:
    """Per-device batches: ``given``, or powers of two around ``reference`` (BATCH_FACTORS),
    none above ``limit``."""
    if given:
        return sorted({b for b in given if b <= limit})
    found = set()
    for factor in BATCH_FACTORS:
        b = max(1, round(reference * factor))
        b = 1 << (b.bit_length() - 1) if factor != 1 else b  # powers of two, and b itself
        if b <= limit:
            found.add(b)
    return sorted(found)


def device_counts(workers: int | None, per_node: int | None, nodes: int | None) -> list[int]:
    """Every count up to ``workers`` here; on a cluster powers of two within a node, then
    powers of two of whole nodes, and every node."""
    if workers is not None:
        return list(range(1, workers + 1))
    assert per_node is not None and nodes is not None
    inside = {1 << k for k in range(per_node.bit_length()) if 1 << k <= per_node} | {per_node}
    across = {per_node * (1 << k) for k in range(nodes.bit_length()) if 1 << k <= nodes}
    return sorted(inside | across | {per_node * nodes})


def candidates(devices: list[int], sizes: list[int], found: list[Variant],
               precisions: list[str], largest_fitting, max_accumulate: int,
               train_samples: int | None, cores: int | None = None) -> list[Candidate]:
    """Every configuration of the space. ``largest_fitting(variant, n, precision)`` is the
    largest per-device batch of ``sizes`` a device holds (None: none fits). One device
    exchanges nothing: it is searched once, under the first variant. ``cores``: on this
    machine, no configuration whose workers and helper processes outnumber its cores (they
    would share cores, which the model does not see)."""
    out: list[Candidate] = []
    for n in devices:
        for v in (found[:1] if n == 1 else found):
            if cores is not None and n > 1 and n + v.helpers > cores:
                continue
            for precision in precisions:
                top = largest_fitting(v, n, precision)
                if top is None:
                    continue
                for b in sizes:
                    if b > top:
                        break
                    if train_samples is not None and n * b > train_samples:
                        break
                    out.append(Candidate(n, b, 1, v, precision))
                a = 2
                while a <= max_accumulate and (train_samples is None
                                               or n * top * a <= train_samples):
                    if top == sizes[-1]:
                        break  # memory does not bind: a larger batch would do it better
                    out.append(Candidate(n, top, a, v, precision))
                    a *= 2
    return out
