"""Memory cgroups this process may create: where they go, how one is limited, read and removed.

Two layouts exist. cgroup v2 (one hierarchy, ``cgroup2`` in /proc/self/mountinfo): a cgroup's
children get ``memory.max`` only when the memory controller is in its
``cgroup.subtree_control``, and a cgroup that holds processes cannot enable it there (the "no
internal processes" rule), so the cgroups go under this process's own cgroup when that already
hands the controller down (the root of a hierarchy), else under its parent, when this process
may write the parent. cgroup v1 (one hierarchy per controller, the ``memory`` one): the cgroups
go under this process's own memory cgroup. Either way this process must be allowed to write
there: root, or a user the cgroup was delegated to.

Each cgroup made here is named ``parascale-mem-<pid>.<start>-<random>`` after its owner
(:mod:`.scratch`), so that one left behind by an owner killed outright is removed by the next
(:func:`sweep`). Nothing here imports torch or psutil at import time: a worker forked from the
fork server enters its cgroup (:func:`enter`) before it allocates anything.
"""
from __future__ import annotations

import errno
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "parascale-mem-"
#: each layout's files: the limit, the swap limit, the out-of-memory kill count, the peak
FILES = {
    1: {"limit": "memory.limit_in_bytes", "swap": "memory.memsw.limit_in_bytes",
        "events": "memory.oom_control", "peak": "memory.max_usage_in_bytes"},
    2: {"limit": "memory.max", "swap": "memory.swap.max", "events": "memory.events",
        "peak": "memory.peak"},
}
REMOVE_WAIT_S = 2.0  # a cgroup whose last process has just exited may take a moment to empty


class Unavailable(Exception):
    """No memory cgroup can be made here; the message says why and what would allow it."""


@dataclass(frozen=True)
class Hierarchy:
    """Where this process may make memory cgroups: ``base`` in a v1 or v2 hierarchy mounted
    at ``mount``."""

    version: int
    base: Path
    mount: Path

    def file(self, group: Path, what: str) -> Path:
        return group / FILES[self.version][what]


def _mounts(text: str) -> list[tuple[str, str, str, set[str]]]:
    """(file system type, mount root, mount point, super options) of /proc/self/mountinfo."""
    found = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and len(tail) >= 3:
            found.append((tail[0], fields[3], fields[4], set(tail[2].split(","))))
    return found


def _under(root: str, path: str, point: str) -> Path | None:
    """The folder of cgroup ``path`` in a hierarchy whose ``root`` is mounted at ``point``."""
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    rest = path[len(root):] if root != "/" else path
    return Path(point) / rest.strip("/")


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK) and os.access(folder / "cgroup.procs", os.W_OK)


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def find(cgroup_text: str | None = None, mountinfo_text: str | None = None) -> Hierarchy:
    """The place this process may make memory cgroups, in whichever hierarchy (v2 or v1)
    holds the memory controller, or :class:`Unavailable` saying why there is none. The texts
    default to /proc/self/cgroup and /proc/self/mountinfo."""
    if not sys.platform.startswith("linux") and cgroup_text is None:
        raise Unavailable(f"memory cgroups are Linux's, and this is {sys.platform}")
    try:
        cgroup_text = Path("/proc/self/cgroup").read_text() if cgroup_text is None \
            else cgroup_text
        mountinfo_text = Path("/proc/self/mountinfo").read_text() if mountinfo_text is None \
            else mountinfo_text
    except OSError as exc:
        raise Unavailable(f"this process's cgroups cannot be read ({exc.strerror})") from exc
    mounts = _mounts(mountinfo_text)
    denied: list[Path] = []
    for line in cgroup_text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # the v2 hierarchy
            for kind, root, point, _ in mounts:
                own = _under(root, path, point) if kind == "cgroup2" else None
                if own is None:
                    continue
                for place in (own, own.parent) if own != Path(point) else (own,):
                    try:
                        handed_down = "memory" in (place / "cgroup.subtree_control") \
                            .read_text().split()
                    except OSError:
                        continue
                    if handed_down and _writable(place):
                        return Hierarchy(2, place, Path(point))
                    if handed_down:
                        denied.append(place)
        elif "memory" in controllers.split(","):
            for kind, root, point, options in mounts:
                own = _under(root, path, point) \
                    if kind == "cgroup" and "memory" in options else None
                if own is None or not (own / FILES[1]["limit"]).is_file():
                    continue
                if _writable(own):
                    return Hierarchy(1, own, Path(point))
                denied.append(own)
    if denied and _read_only(denied[0]):
        raise Unavailable(f"the cgroup file system holding {denied[0]} is mounted read-only "
                          "(as in most containers: give the container a writable one, or run "
                          "on the host)")
    if denied:
        raise Unavailable(f"this user may not create cgroups in {denied[0]} (run as root, or "
                          "where that cgroup is delegated to this user)")
    raise Unavailable("no memory cgroup controller is available to this process (it needs "
                      "cgroup v1's memory hierarchy, or cgroup v2 with the memory controller "
                      "enabled for this process's cgroup or its parent)")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise Unavailable(f"cannot write {text!r} to {path} ({exc.strerror})") from exc


def make_job(where: Hierarchy, name: str, ranks: int, limit: int) -> list[Path]:
    """Folder ``name`` under ``where.base`` holding one cgroup per rank, each limited to
    ``limit`` bytes with no swap beyond it; the ranks' folders. :class:`Unavailable` (and
    nothing left behind) when one cannot be made."""
    job = where.base / name
    try:
        job.mkdir()
    except OSError as exc:
        raise Unavailable(f"cannot create the cgroup {job} ({exc.strerror})") from exc
    try:
        if where.version == 2:  # the ranks' memory.max exists only once the job hands it down
            _write(job / "cgroup.subtree_control", "+memory")
        groups = []
        for rank in range(ranks):
            group = job / f"rank{rank}"
            try:
                group.mkdir()
            except OSError as exc:
                raise Unavailable(f"cannot create the cgroup {group} ({exc.strerror})") from exc
            groups.append(group)
            _write(where.file(group, "limit"), str(limit))
            swap = where.file(group, "swap")
            if swap.exists():  # v1: memory and swap together; v2: swap alone
                _write(swap, str(limit) if where.version == 1 else "0")
            if (group / "memory.oom.group").exists():  # v2: a worker dies with its children
                _write(group / "memory.oom.group", "1")
        return groups
    except BaseException:
        remove(job)
        raise


def oom_kills(where: Hierarchy, group: Path) -> int:
    """How many processes of ``group`` the kernel killed at its limit (0 when unreadable)."""
    try:
        lines = where.file(group, "events").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def peak(group: Path) -> int | None:
    """The most memory ``group`` was charged so far, or None where the kernel does not say
    (cgroup v2 before Linux 5.19 has no ``memory.peak``)."""
    for version in (1, 2):
        try:
            text = (group / FILES[version]["peak"]).read_text().strip()
        except OSError:
            continue
        if text.isascii() and text.isdigit():
            return int(text)
    return None


def remove(job: Path, wait_s: float = REMOVE_WAIT_S) -> bool:
    """Remove ``job`` and its ranks' cgroups once their processes are gone (a process that has
    just exited may take a moment to leave); False when one still holds a process after
    ``wait_s`` (the next :func:`sweep` takes it)."""
    deadline = time.monotonic() + wait_s
    for group in sorted(job.glob("rank*"), reverse=True) + [job]:
        while True:
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    return False
                time.sleep(0.02)
    return True


def sweep(where: Hierarchy) -> list[Path]:
    """Remove the cgroups under ``where.base`` whose owner is gone; return them."""
    from parascale.runtime.scratch import owner_alive

    removed: list[Path] = []
    try:
        entries = list(os.scandir(where.base))
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False) \
                and not owner_alive(entry.name, PREFIX) and remove(Path(entry.path), 0.0):
            removed.append(Path(entry.path))
    return removed


def enter(group: str) -> None:
    """Move this process into cgroup ``group`` (a folder); OSError when it may not."""
    Path(group, "cgroup.procs").write_text(str(os.getpid()))
