"""``--device-memory SIZE``: a per-worker memory cap on the CPU, enforced by a memory cgroup.

On a GPU the device's memory is the limit, and going over it is an out-of-memory result. A CPU
worker has no such limit of its own, so the launcher gives it one: each worker of a local launch
runs in a memory cgroup of its own (:mod:`.cgroups`) limited to SIZE, with no swap beyond it.
The worker enters it first thing, before it allocates anything (:func:`enter`, from
:mod:`.processes`); what it then allocates, and what the processes it starts allocate (its
DataLoader workers), counts. The pages it shares with the fork server it was forked from (the
interpreter and torch, imported there once) were charged when the server touched them, so a
forked worker's cap is its own memory. The kernel kills a worker that goes over its cap;
the launcher reads the cgroup's count of such kills, and the run ends as ``oom`` naming the rank
and the cap (:meth:`JobCaps.oom_line`), as a CUDA out-of-memory error does.

The cap is part of the launch: a training job's configuration holds it (``device_memory``), the
one local launch of a job (training/launch/launcher.py, for ``train``, ``parascale run`` and
``parascale.script.launch.run``) hands it to :func:`parascale.runtime.launch`, and each attempt
of the launch makes its workers' cgroups (:class:`JobCaps`); a launch without it (``comm``) is
uncapped.

Sizes are binary: a number in ASCII digits, with or without a fraction, and a unit K, M, G or T
(powers of 1024, however written: 3G, 3GB and 3GiB are all 3 x 2^30 bytes, as Slurm's --mem
and docker's --memory read them), or none (or B) for bytes. ``find-batch --memory-limit`` reads
its sizes here too.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from parascale.errors import UsageError
from parascale.runtime import cgroups, contract

ENV = contract.MEMORY_CGROUP
_UNITS = {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(?:([KMGT])(?:I?B)?|B)?", re.ASCII)
#: the least cap taken: a worker started as a fresh interpreter (where the fork server cannot
#: be used) is charged for the interpreter and the imports of torch and parascale alone, 364 MiB
#: with torch's files cached (480 MiB for torch read cold), before it builds a model
FLOOR = 400 << 20
FLAG = "--device-memory"
#: what a size looks like, for messages
SIZE_WORDS = "a size such as 3GiB, 512MiB or 2.5G (powers of 1024, ASCII digits)"


def read_size(text: object) -> int | None:
    """'3GiB', '3G', '512MiB', '2.5G' -> bytes (powers of 1024), '1000' or '1000B' -> 1000;
    None for anything else, or nothing."""
    match = _SIZE.fullmatch(text.strip().upper()) if isinstance(text, str) else None
    size = int(float(match.group(1)) * _UNITS[match.group(2) or "B"]) if match else 0
    return size if size > 0 else None


def parse_size(text: str, flag: str = FLAG) -> int:
    """:func:`read_size`, or a UsageError naming ``flag``."""
    size = read_size(text)
    if size is None:
        raise UsageError(f"{flag} expects {SIZE_WORDS}, got {text!r}")
    return size


def size_text(size: int) -> str:
    """3221225472 -> '3 GiB', 536870912 -> '512 MiB', 1610612736 -> '1.5 GiB'."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB")):
        if size >= unit:
            return f"{size / unit:.4g} {name}"
    return f"{size / 1024:.4g} KiB"


def check(text: str | None, gpus: tuple[int, ...] | None, device: str) -> None:
    """Everything about ``--device-memory`` that can be known before a run, one line for the
    first thing wrong: the size, the device, the machine and the platform (the strategy:
    :func:`check_helpers`)."""
    if text is None:
        return
    size = parse_size(text)
    if gpus is not None or device == "cuda":
        raise UsageError(f"{FLAG} caps a CPU worker's memory; on a GPU the device's memory is "
                         f"the limit: leave out {FLAG} or --gpus")
    if size < FLOOR:
        raise UsageError(f"{FLAG} {text} is below the {size_text(FLOOR)} a worker needs for "
                         "the interpreter and torch alone, before any model; give at least "
                         f"{size_text(FLOOR)}")
    from parascale.runtime import memory

    usable = memory.limit_bytes()  # the machine's memory, or this process's cgroup limit
    if size > usable:
        raise UsageError(f"{FLAG} {text} is more than the {size_text(usable)} this machine "
                         "lets this process use, so it would cap nothing; give less")
    hierarchy()


def check_helpers(text: str | None, sync: str, helpers: int) -> None:
    """A cap with a strategy that starts ``helpers`` processes of its own: they are rank 0's
    children, so their memory would count against rank 0's cap."""
    if text is not None and helpers:
        raise UsageError(f"{FLAG} cannot cap --sync {sync}: its {helpers} helper process(es) "
                         "are rank 0's children, so their memory would count against rank 0's "
                         "cap; choose another strategy, or leave out " + FLAG)


def hierarchy() -> cgroups.Hierarchy:
    """Where the workers' cgroups go; a UsageError saying why there is no such place."""
    try:
        return cgroups.find()
    except cgroups.Unavailable as exc:
        raise UsageError(f"{FLAG} needs a memory cgroup per worker, and {exc}; or leave out "
                         f"{FLAG}") from exc


class JobCaps:
    """One launch's cgroups, one per rank, each limited to ``cap`` bytes."""

    def __init__(self, size: int, cap: int):
        from parascale.runtime.scratch import owner_tag

        self.cap, self.where = cap, hierarchy()
        cgroups.sweep(self.where)  # those of launchers killed outright
        name = f"{cgroups.PREFIX}{owner_tag()}-{_random()}"
        try:
            self.groups = cgroups.make_job(self.where, name, size, cap)
        except cgroups.Unavailable as exc:
            raise UsageError(f"{FLAG} needs a memory cgroup per worker, and {exc}; or leave "
                             f"out {FLAG}") from exc
        self.job = self.where.base / name

    def env(self, rank: int) -> dict[str, str]:
        """What tells worker ``rank`` its cgroup."""
        return {ENV: str(self.groups[rank])}

    def oom_line(self, rank: int) -> str | None:
        """The words after 'rank R: ' when the kernel killed a process of that rank's cgroup at
        its cap, else None."""
        if not cgroups.oom_kills(self.where, self.groups[rank]):
            return None
        return (f"ran out of memory: its {FLAG} cap is {size_text(self.cap)} (the kernel's "
                "out-of-memory killer ended it there)")

    def remove(self) -> None:
        cgroups.remove(self.job)


def _random() -> str:
    import secrets

    return secrets.token_hex(4)


def enter(env: dict[str, str]) -> None:
    """In a starting worker, before it allocates: enter the cgroup ``env`` names, if any. A
    worker that cannot says so in one line and exits 1 (it must not run uncapped)."""
    group = env.get(ENV)
    if not group:
        return
    try:
        cgroups.enter(group)
    except OSError as exc:
        print(f"parascale: this worker cannot enter its memory cgroup {group} "
              f"({exc.strerror}), so its {FLAG} cap would not hold", file=sys.stderr,
              flush=True)
        import os

        os._exit(1)


def own_peak() -> int | None:
    """The most memory this worker's cgroup was charged so far, or None without a cap."""
    import os

    group = os.environ.get(ENV)
    return cgroups.peak(Path(group)) if group else None
