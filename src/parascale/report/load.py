"""Reading run records for the report: never re-runs anything, never crashes on a bad file.

A STUDY argument may be

- a bench study folder, holding ``runs/<config_id>/record.json`` (one per configuration);
- a plain ``parascale train --out`` folder, holding ``record.json`` directly;
- a folder of such folders (``*/record.json``);
- a path to one record file.

Everything that cannot be used is kept as a :class:`Problem` with a reason, so that the report can
list it: an unreadable or non-parascale JSON file (files are read by
:func:`parascale.record.read_record`: limits on size, nesting and strings, field types checked),
an ``ok`` record without its summary figures, a bench run folder without a record (interrupted).
Records whose ``status`` is failed/oom/skipped are valid records: they are loaded and listed with
their reasons, they just contribute no numbers.
Only a path that does not exist, or one without any record file, is a usage error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parascale import sync
from parascale.errors import UsageError
from parascale.record import RECORD_NAME, read_record
from parascale.safejson import Refused


@dataclass(frozen=True)
class Problem:
    """A file or run folder that contributed nothing, and why (shown in the report)."""

    path: Path
    study: str
    reason: str
    kind: str = "unreadable"  # missing (run folder without record) | unreadable | invalid


@dataclass(eq=False)
class RunRecord:
    """One parsed run record plus where it came from; accessors tolerate missing fields."""

    path: Path
    study: str  # label of the STUDY argument this record was found under
    data: dict[str, Any]

    def get(self, *keys: str, default: Any = None) -> Any:
        """Nested lookup (``get("summary", "steady_throughput")``) that never raises."""
        node: Any = self.data
        for key in keys:
            if not isinstance(node, dict) or node.get(key) is None:
                return default
            node = node[key]
        return node

    @property
    def status(self) -> str:
        return str(self.data.get("status"))

    @property
    def reason(self) -> str:
        return str(self.data.get("reason") or "no reason recorded")

    @property
    def model(self) -> str:
        """The model, or a user's task (``--task module:function``), which brings its own."""
        return str(self.get("config", "task", default=None) or
                   self.get("config", "model", default="?"))

    @property
    def dataset(self) -> str:
        if self.get("config", "task", default=None):
            return "its own data"
        return str(self.get("config", "dataset", default="?"))

    def task_fact(self, key: str, kind: type | tuple, default: Any) -> Any:
        """One fact of the record's ``task`` section (unit, units_per_sample, judge), or
        ``default`` for a record of an image task from before tasks, or a wrong type."""
        value = self.get("task", key, default=default)
        return value if isinstance(value, kind) and not isinstance(value, bool) else default

    @property
    def sync(self) -> str:
        # a record from before strategies were chosen ran the default one
        return str(self.get("config", "sync", default=sync.DEFAULT))

    @property
    def workers(self) -> int | None:
        """N = derived.world_size; a skipped record may only have the requested config.workers."""
        value = self.get("derived", "world_size", default=self.get("config", "workers"))
        return value if isinstance(value, int) else None

    @property
    def scaling(self) -> str | None:
        return self.get("study", "scaling")

    @property
    def baseline(self) -> bool:
        return bool(self.get("study", "baseline", default=False))

    @property
    def config_id(self) -> str:
        return str(self.get("study", "config_id", default=self.path.parent.name))

    def describe(self) -> str:
        """Short human description of the configuration, for lists of unfinished runs."""
        parts = [f"{self.model} on {self.dataset}", f"N={self.workers if self.workers else '?'}"]
        if self.scaling:
            parts.append(f"{self.scaling} scaling")
        parts.append(f"sync {self.sync}")
        if self.baseline:
            parts.append("baseline (no gradient exchange)")
        if self.get("study", "repeat") is not None:
            parts.append(f"repeat {self.get('study', 'repeat')}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Source:
    """One STUDY argument as given, with the label its series carry in tables and plots."""

    path: Path
    label: str
    record_files: int


@dataclass
class Loaded:
    """Everything the report is made from: parseable records (any status) and problems."""

    records: list[RunRecord] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    outside: list[RunRecord | Problem] = field(default_factory=list)  # not in their plan.json

    @property
    def ok(self) -> list[RunRecord]:
        return [r for r in self.records if r.status == "ok"]

    @property
    def unfinished(self) -> list[RunRecord]:
        return [r for r in self.records if r.status != "ok"]


def load_records(paths: list[Path] | list[str]) -> Loaded:
    """Load every record under the STUDY paths; raise UsageError only for unusable arguments."""
    if not paths:
        raise UsageError("report: give at least one STUDY folder or record.json file")
    loaded = Loaded()
    labels = _labels([Path(p) for p in paths])
    for path, label in zip((Path(p) for p in paths), labels):
        if not path.exists():
            raise UsageError(f"report: {path} does not exist (expected a study folder or a record.json)")
        if not path.is_dir() and not path.is_file():
            raise UsageError(f"report: {path} is neither a folder nor a file (expected a study "
                             "folder or a record.json)")
        try:
            files, missing = _find(path)
        except OSError as exc:
            raise UsageError(f"report: cannot read {path}: {exc.strerror or exc}") from None
        if not files:
            raise UsageError(
                f"report: no run records in {path} (expected runs/<config>/{RECORD_NAME}, "
                f"{RECORD_NAME}, or */{RECORD_NAME})"
            )
        loaded.sources.append(Source(path, label, len(files)))
        for folder in missing:
            loaded.problems.append(Problem(
                folder, label, f"no {RECORD_NAME}: the run did not finish (interrupted or still running)",
                "missing"))
        for file in files:
            record, reason, kind = _read(file, label)
            if record is not None:
                loaded.records.append(record)
            else:
                loaded.problems.append(Problem(file, label, reason, kind))
    if not loaded.records:
        first = loaded.problems[0]
        raise UsageError(f"report: no parascale run record could be read ({first.path}: {first.reason})")
    return loaded


def _labels(paths: list[Path]) -> list[str]:
    """Series labels: the folder names the user typed, made unique when two are equal."""
    names = [_folder(p).name or str(_folder(p)) for p in paths]
    labels = []
    for path, name in zip(paths, names):
        if names.count(name) > 1:
            folder = _folder(path)
            name = f"{folder.parent.name}/{folder.name}" if folder.parent.name else str(folder)
        labels.append(name)
    # still equal (the same folder twice, or a/x vs b/x under equal parents): number them
    return [f"{lab} #{labels[:i].count(lab) + 1}" if labels.count(lab) > 1 else lab
            for i, lab in enumerate(labels)]


def _folder(path: Path) -> Path:
    """The folder a STUDY argument names (a record file's own folder); absolute so '.' has a name."""
    path = path.resolve()
    return path.parent if path.is_file() else path


def _find(path: Path) -> tuple[list[Path], list[Path]]:
    """Record files under ``path``, and bench run folders that hold no record."""
    if path.is_file():
        return [path], []
    if (path / RECORD_NAME).is_file():
        return [path / RECORD_NAME], []
    runs = path / "runs"
    base = runs if runs.is_dir() else path
    files: list[Path] = []
    missing: list[Path] = []
    for child in sorted(p for p in base.iterdir() if p.is_dir()):
        if (child / RECORD_NAME).is_file():
            files.append(child / RECORD_NAME)
        elif base is runs:
            # outside runs/ a folder without a record is not a run (e.g. report/)
            missing.append(child)
    return files, missing


def _read(file: Path, label: str) -> tuple[RunRecord | None, str, str]:
    """Parse and check one file: the record, or None with the reason and kind of problem."""
    try:
        data = read_record(file)
    except Refused as exc:
        return None, (f"unreadable: {exc}" if exc.kind == "unreadable" else str(exc)), exc.kind
    reason = _invalid(data)
    if reason:
        return None, reason, "invalid"
    return RunRecord(file, label, data), "", ""


def _invalid(data: dict[str, Any]) -> str:
    """Why a run record cannot be used by the report, or '' when it can."""
    if data["status"] != "ok":
        return ""
    record = RunRecord(Path(), "", data)
    if not isinstance(record.get("config", "model"), str) and \
            not isinstance(record.get("config", "task"), str):  # a task's record: model null
        return "status ok but config.model is missing"
    if not isinstance(record.get("derived", "world_size"), int) or record.get("derived", "world_size") < 1:
        return "status ok but derived.world_size is missing or not a positive integer"
    for key in ("steady_throughput", "steady_epoch_time_s"):
        value = record.get("summary", key)
        if not _positive(value):
            return f"status ok but summary.{key} is missing or not a positive number ({value!r})"
    return ""


def _positive(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)
