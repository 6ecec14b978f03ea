"""Checkpoints on disk: save, verify, list, prune and load (the layout is docs/checkpoints.md).

One checkpoint is two files in ``DIR/checkpoints``::

    step-00000120.pt     torch.save of the run's state; read back with weights_only=True
    step-00000120.json   its manifest: step, epoch, size and SHA-256 of the .pt, the config

or, under a strategy whose ranks each hold a part of the state (``Strategy.shards_checkpoint``),
a folder and its manifest::

    step-00000120/       every rank's part (torch.distributed.checkpoint, sharded.py)
                         and run.pt: the rest of the run's state, as in the .pt above
    step-00000120.json   the same manifest, with the size and SHA-256 of every file in the folder

The folder is filled under a temporary name and renamed once whole; everything below holds
for it as for the .pt, file by file.

Each is written atomically (a temporary file in the same folder, fsync, rename), the .pt
first; the folder is fsynced after each rename. A checkpoint counts only when its manifest
exists, reads, and its .pt has the size and SHA-256 the manifest states: a kill between the
two renames leaves a .pt without manifest (ignored), and a truncated or corrupted file fails
the checksum, so :func:`newest` says so and takes the one before. So does a checkpoint whose
checksum matches but whose manifest or state is not what a run writes (a bug, a hand edit, a
forgery): the manifest is read within limits and checked against :data:`MANIFEST`, the state's
outline against :data:`STATE`, before a run takes it. Only rank 0 writes (every rank writes
its part of a sharded one). A full disk is one line (:class:`~parascale.errors.NoSpace`) and
leaves the earlier checkpoints as they were: nothing is pruned before a checkpoint is whole.

The .pt is torch's own format, loadable without parascale (``torch.load(p, weights_only=True)``):
tensors, numbers, strings, lists and dicts only. ``torch.distributed.checkpoint`` is used only
where ranks hold parts: its gain is sharded state written by every rank in parallel and
resharding, and where every rank holds a whole model it would add files and no checksum.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from parascale import lazy, safejson
from parascale.errors import NoSpace
from parascale.files import atomic_write, no_space, no_space_named

if TYPE_CHECKING:
    import torch
else:  # resume's checks of --out list checkpoints without torch (the command line's first line)
    torch = lazy.module("torch", globals())

FORMAT = "parascale.checkpoint/1"
FOLDER = "checkpoints"
LOG_NAME = "log.txt"  # the unfinished run's console log, beside its checkpoints
_NAME = re.compile(r"step-(\d{8,})(\.pt)?")  # no suffix: a sharded checkpoint's folder
_OURS = re.compile(r"step-\d{8,}(\.pt|\.json)?|" + re.escape(LOG_NAME))  # written or removed here
STATE_FILE = "run.pt"  # in a sharded checkpoint's folder: what the .pt holds elsewhere
CHUNK = 1 << 20
MANIFEST_BYTES = 4 << 20  # a manifest is a few KB: its configuration and a few numbers

#: a manifest's fields and their types (safejson.check_types); every one is required
MANIFEST: dict[str, Any] = {
    "format": (str,), "step": (int,), "epoch": (int,), "world_size": (int,), "config": {},
    "bytes": (int,), "sha256": (str,)}
#: fields a manifest may have: a folder's files (name: bytes and SHA-256), and the batch and
#: learning rate it trained with (what a run on another number of workers must keep)
OPTIONAL: dict[str, Any] = {"files": {}, "global_batch": (int,), "effective_lr": (int, float)}
#: the outline of the state that resuming reads (state.py), every part required but
#: ``shared`` (the model and optimizer when every rank holds the same, else each rank's own)
STATE: dict[str, Any] = {
    "position": {"step": (int,), "epoch": (int,), "done": (int,)}, "replicas_agree": (bool,),
    "shared": {"model": {}, "optimizer": {}}, "ranks": [{"strategy": {}, "rng": {}, "rows": {}}],
    "progress": {}}


def name(step: int) -> str:
    return f"step-{step:08d}"


def folder_of(out: str | os.PathLike) -> Path:
    return Path(os.path.abspath(out)) / FOLDER


@dataclass
class Found:
    """One checkpoint in a folder: its .pt, its step, its manifest, and what is wrong with it
    (None when it verified)."""

    path: Path
    step: int
    manifest: dict[str, Any] = field(default_factory=dict)  # empty until it is read
    problem: str | None = None
    #: the epoch its run's --steps cut short at the run's end, when it was written there
    cut_short: int | None = None

    @property
    def manifest_path(self) -> Path:
        return self.path.with_suffix(".json")

    @property
    def sharded(self) -> bool:
        """A folder of every rank's part (sharded.py), not one .pt."""
        return self.path.suffix != ".pt"

    @property
    def label(self) -> str:
        """``checkpoints/step-00000120.pt``: how records and messages name it."""
        return f"{self.path.parent.name}/{self.path.name}{'/' if self.sharded else ''}"


class _Hashing:
    """A file object for ``torch.save`` that hashes and counts what it writes."""

    def __init__(self, handle: BinaryIO):
        self.handle, self.sha, self.size = handle, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


def _save_hashed(state: dict[str, Any], handle: BinaryIO) -> _Hashing:
    """``torch.save`` of ``state`` into ``handle``, hashed and counted on the way."""
    writer = _Hashing(handle)
    # torch.save writes to any object with write and flush; its stubs ask for a file
    torch.save(state, cast(BinaryIO, writer))
    return writer


def _fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable (a crash after rename could otherwise lose it)."""
    with contextlib.suppress(OSError):  # not every file system lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Written atomically (parascale.files), then the rename made durable."""
    atomic_write(path, write)
    _fsync_folder(path.parent)


def save(folder: Path, step: int, state: dict[str, Any], manifest: dict[str, Any]) -> Found:
    """Write ``state`` as checkpoint ``step`` in ``folder``, then its manifest (``manifest``
    plus format, step, size and checksum). Returns the checkpoint, verified by construction."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name(step)}.pt"
    hashed: list[_Hashing] = []

    def write_state(handle: BinaryIO) -> None:
        hashed.append(_save_hashed(state, handle))

    try:
        _atomic(path, write_state)
        facts = {"format": FORMAT, "step": step, **manifest,
                 "bytes": hashed[0].size, "sha256": hashed[0].sha.hexdigest()}
        _write_manifest(path, facts, lambda: path.unlink(missing_ok=True))
    except NoSpace as exc:
        raise no_space(path, exc, KEPT) from exc
    return Found(path, step, facts)


KEPT = "the checkpoints before it are as they were; free some space and continue the run with " \
    "--resume"


def _write_manifest(path: Path, facts: dict[str, Any], undo: Callable[[], None]) -> None:
    """The manifest of checkpoint ``path``, written last: it makes the checkpoint count."""
    text = safejson.dumps(facts, indent=2) + "\n"
    try:
        _atomic(path.with_suffix(".json"), lambda handle: handle.write(text.encode()))
    except NoSpace:
        undo()  # never counted without its manifest: give the room back
        raise


def temporary(folder: Path, step: int) -> Path:
    """Where every rank writes its part of sharded checkpoint ``step`` before it is whole."""
    return folder / f".{name(step)}.tmp"


def file_facts(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256, as a sharded checkpoint's manifest lists them."""
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def _listing_digest(files: dict[str, dict[str, Any]]) -> str:
    """One SHA-256 over a folder's listing (names, sizes, checksums): the manifest's ``sha256``
    for a folder, so that it vouches for the set of files as for each one."""
    text = "".join(f"{n} {f['bytes']} {f['sha256']}\n" for n, f in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def commit(folder: Path, step: int, state: dict[str, Any], manifest: dict[str, Any],
           files: dict[str, dict[str, Any]]) -> Found:
    """Rank 0's end of a sharded checkpoint, once every rank's part is in
    :func:`temporary`: write ``state`` there as run.pt, hash what no rank has hashed yet
    (``files`` holds what the ranks did), rename the folder to its name, then its manifest."""
    tmp, path = temporary(folder, step), folder / name(step)
    try:
        with no_space_named(tmp / STATE_FILE), open(tmp / STATE_FILE, "wb") as handle:
            writer = _save_hashed(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        files = {**files, STATE_FILE: {"bytes": writer.size, "sha256": writer.sha.hexdigest()}}
        for left in sorted(set(os.listdir(tmp)) - set(files)):  # DCP's .metadata, rank 0's
            files[left] = file_facts(tmp / left)
        _fsync_folder(tmp)
        remove(path.with_suffix(".json"))  # one a failed attempt left at this step, if any
        remove(path)
        os.rename(tmp, path)
        _fsync_folder(folder)
        facts = {"format": FORMAT, "step": step, **manifest, "files": files,
                 "bytes": sum(f["bytes"] for f in files.values()),
                 "sha256": _listing_digest(files)}
        _write_manifest(path, facts, lambda: remove(path))
    except NoSpace as exc:
        remove(tmp)
        raise no_space(path, exc, KEPT) from exc
    return Found(path, step, facts)


def remove(path: Path) -> None:
    """A checkpoint's file or folder gone (nothing when it is not there)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def listing(folder: Path) -> list[Found]:
    """Every checkpoint file in ``folder``, oldest first, not yet verified."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [Found(folder / n, int(m.group(1))) for n in names if (m := _NAME.fullmatch(n))]
    return sorted(found, key=lambda f: f.step)


def in_the_way(folder: Path) -> list[Path]:
    """What in ``folder`` bears the name of a checkpoint's file or of the log but is not a file
    (a folder, a FIFO, a dangling link): writing it or removing it would fail mid-run."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [folder / n for n in names if _OURS.fullmatch(n) and not (
        (folder / n).is_dir() if _is_folder_name(n) else (folder / n).is_file())]


def _is_folder_name(name: str) -> bool:
    """A sharded checkpoint's name (a folder), not a file's."""
    return _NAME.fullmatch(name) is not None and not name.endswith(".pt")


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def _missing(data: Any, spec: dict[str, Any], where: str = "") -> str | None:
    """The first key of ``spec`` (nested objects included) that ``data`` lacks or has as null."""
    for key, sub in spec.items():
        value = data.get(key) if isinstance(data, dict) else None
        if value is None:
            return f"{where}{key}"
        if isinstance(sub, dict) and sub and (deeper := _missing(value, sub, f"{where}{key}.")):
            return deeper
    return None


def _read_manifest(found: Found) -> dict[str, Any] | str:
    """The manifest of ``found``, or what is wrong with it."""
    if not os.path.lexists(found.manifest_path):
        return "it has no manifest (the write did not finish)"
    try:
        manifest = safejson.load(found.manifest_path, max_bytes=MANIFEST_BYTES)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return f"its manifest is not a {FORMAT} manifest"
        safejson.check_types(manifest, {**MANIFEST, **OPTIONAL})
    except safejson.Refused as exc:
        return f"its manifest is {'unreadable' if exc.kind == 'unreadable' else 'invalid'} ({exc})"
    lacking = _missing(manifest, {k: None for k in MANIFEST})
    if lacking:
        return f"its manifest has no {lacking}"
    if manifest["step"] != found.step:
        return f"its manifest is for step {manifest['step']}"
    return manifest


def verify(found: Found) -> Found:
    """``found`` with its manifest read and ``problem`` set when it cannot be used."""
    manifest = _read_manifest(found)
    if isinstance(manifest, str):
        found.problem = manifest
        return found
    found.manifest = manifest
    if found.sharded:
        found.problem = _folder_problem(found.path, manifest)
        return found
    try:
        size = found.path.stat().st_size
        if size != manifest["bytes"]:
            found.problem = f"it has {size:,} bytes where its manifest says {manifest['bytes']:,}"
        elif _sha256(found.path) != manifest["sha256"]:
            found.problem = "its SHA-256 checksum does not match its manifest (corrupted)"
    except OSError as exc:
        found.problem = f"it cannot be read ({exc.strerror or exc})"
    return found


def _folder_problem(path: Path, manifest: dict[str, Any]) -> str | None:
    """What is wrong with a sharded checkpoint's folder against its manifest (None: nothing):
    exactly the files it lists, each of its size and checksum."""
    files = manifest.get("files")
    if not isinstance(files, dict) or STATE_FILE not in files or not all(
            isinstance(f, dict) and isinstance(f.get("bytes"), int)
            and isinstance(f.get("sha256"), str) for f in files.values()):
        return "its manifest does not list its files with their sizes and checksums"
    if manifest["sha256"] != _listing_digest(files):
        return "its manifest's list of files does not match its SHA-256 checksum"
    try:
        present = set(os.listdir(path))
        if lacking := sorted(set(files) - present):
            return f"it lacks {lacking[0]} (the write did not finish, or it was damaged)"
        if extra := sorted(present - set(files)):
            return f"it holds {extra[0]}, which its manifest does not list"
        for file, facts in sorted(files.items()):
            size = (path / file).stat().st_size
            if size != facts["bytes"]:
                return f"its {file} has {size:,} bytes where its manifest says {facts['bytes']:,}"
            if _sha256(path / file) != facts["sha256"]:
                return f"its {file}'s SHA-256 checksum does not match its manifest (corrupted)"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    return None


def state_problem(saved: Any, manifest: dict[str, Any]) -> str | None:
    """What is wrong with the loaded state of a checkpoint with ``manifest`` (None: nothing)."""
    if not isinstance(saved, dict):
        return f"it holds a {type(saved).__name__}, not a run's state"
    try:
        safejson.check_shape(saved)  # without recursion: nothing deeper than a run's state
        safejson.check_types(saved, STATE)
    except safejson.Refused as exc:
        return f"its state is malformed ({exc})"
    # a sharded checkpoint keeps the model and optimizer beside the state (sharded.py)
    sharded = saved.get("sharded") is True
    needs = {k: v for k, v in STATE.items()
             if k != "shared" or (saved["replicas_agree"] and not sharded)}
    lacking = _missing(saved, needs)
    if lacking is None and not saved["replicas_agree"] and not sharded:
        lacking = next((f"ranks.{r}.{gap}" for r, part in enumerate(saved["ranks"])
                        if (gap := _missing(part, STATE["shared"]))), None)
    if lacking is None:
        lacking = next((f"ranks.{r}.{gap}" for r, part in enumerate(saved["ranks"])
                        if (gap := _missing(part, STATE["ranks"][0]))), None)
    if lacking:
        return f"its state has no {lacking}"
    if saved["position"]["step"] != manifest["step"]:
        return (f"its state is at step {saved['position']['step']} where its manifest says "
                f"{manifest['step']}")
    if len(saved["ranks"]) != manifest["world_size"]:
        return (f"its state has {len(saved['ranks'])} rank(s) where its manifest says "
                f"{manifest['world_size']}")
    return None


def inspect(found: Found) -> Found:
    """``found`` (verified) with ``problem`` set when its state cannot be a run's: loaded
    (memory-mapped: only its outline is read) and checked against :data:`STATE`."""
    try:
        saved = load(found)
    except Exception as exc:  # noqa: BLE001 - pickle's, torch's, recursion: not a torch file of data
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        found.problem = f"torch cannot load it ({type(exc).__name__}: {first})"
        return found
    found.problem = state_problem(saved, found.manifest)
    if found.problem is None and found.sharded:
        # torch.distributed.checkpoint: only here
        from parascale.training.checkpoint import dcp_metadata

        found.problem = dcp_metadata.metadata_problem(found.path) or \
            dcp_metadata.shards_problem(found.path)
    epochs = saved["progress"].get("epochs") if found.problem is None else None
    last = epochs[-1] if isinstance(epochs, list) and epochs else None
    if isinstance(last, dict) and last.get("partial") is True and \
            saved["position"]["done"] == 0:
        found.cut_short = last.get("epoch")
    return found


def newest(folder: Path, say: Callable[[str], None] = print) -> tuple[Found | None, list[Found]]:
    """The newest checkpoint in ``folder`` that verifies and holds a run's state
    (:func:`inspect`), and the newer ones that did not (each one said in a line through
    ``say``, with the one tried next)."""
    damaged: list[Found] = []
    for found in reversed(listing(folder)):
        verify(found)
        if found.problem is None:
            inspect(found)
        if found.problem is None:
            return found, damaged
        damaged.append(found)
        say(f"parascale: checkpoint {found.label} cannot be used: {found.problem}; "
            "trying the one before")
    return None, damaged


def prune(folder: Path, keep: int, current: int) -> list[Path]:
    """After checkpoint ``current`` is written: remove every checkpoint past it (left by an
    attempt that went further before it failed: this run is writing its own again) and all
    but the newest ``keep``, manifests first, and temporaries a killed write left."""
    removed = []
    present = listing(folder)
    past = [f for f in present if f.step > current]
    mine = [f for f in present if f.step <= current]
    for found in past + mine[:max(0, len(mine) - keep)]:
        for path in (found.manifest_path, found.path):
            if os.path.lexists(path):
                remove(path)
                removed.append(path)
    for leftover in folder.glob(".step-*.tmp"):  # a file (atomic_write's) or a sharded folder
        remove(leftover)
    return removed


def load(found: Found | Path) -> dict[str, Any]:
    """The state saved in a checkpoint, on the CPU, read with ``weights_only=True`` (nothing
    but tensors and plain values can come out of the file) and memory-mapped, so that a rank
    pages in only the parts it uses."""
    path = found.path if isinstance(found, Found) else Path(found)
    if path.suffix != ".pt":  # a sharded checkpoint: the model and optimizer stay in DCP's files
        path = path / STATE_FILE
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
