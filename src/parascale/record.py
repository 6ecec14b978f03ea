"""The run record's contract, the facts of the machine that ran, and parascale's version.

Every layer meets here and nowhere else: training writes records, ``comm`` writes its own,
``bench`` files and resumes them, ``report`` reads them. This module imports nothing of
parascale but :mod:`parascale.files` and :mod:`parascale.safejson` (torch only inside
:func:`environment`), so that any of them can use it without importing another layer.
The fields are described in docs/record.md.
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from parascale.files import atomic_write_text
from parascale import safejson
from parascale.safejson import Refused, check_types, load

VERSION = "0.1.0"  # the same as pyproject.toml's; parascale.__version__ is this

SCHEMA = "parascale.run/1"
RECORD_NAME = "record.json"
MODEL_NAME = "model.pt"  # beside the record when the run saved its model
TRACES_NAME = "traces"  # beside the record with --profile: one trace per rank
LOG_NAME = "log.txt"  # beside the record: rank 0's console output (and the launcher's)
STATUSES = ("ok", "failed", "oom", "skipped")
COMM_SCHEMA = "parascale.comm/1"  # ``parascale comm``'s record, described in docs/strategies.md
COMM_NAME = "comm.json"
PLAN_SCHEMA = "parascale.study/1"  # a study's plan.json, written by bench

# The parts of a run record that the report and the study runner read, with the types they
# need: a mapping is a section (itself checked), [spec] a list of such items, a tuple the
# accepted types. Every field may be missing or null; what must be present is the reader's
# business (the report requires the summary figures of an ok record, for example).
_NUMBER = (int, float)
RUN_RECORD: dict[str, Any] = {
    "schema": (str,), "status": (str,), "reason": (str,),
    "config": {"model": (str,), "dataset": (str,), "sync": (str,), "workers": (int,)},
    "derived": {"world_size": (int,), "per_device_batch": (int,), "global_batch": (int,)},
    "environment": {},
    "epochs": [{"epoch": _NUMBER, "elapsed_s": _NUMBER, "test_accuracy": _NUMBER}],
    "steps": {"phases": {"step": {"p50": _NUMBER, "p95": _NUMBER, "max": _NUMBER}},
              "per_rank": [{"step_p50_s": _NUMBER, "step_p95_s": _NUMBER}]},
    "time_to_accuracy": {"reached": (bool,), "target": _NUMBER, "elapsed_s": _NUMBER,
                         "epoch": _NUMBER},
    "summary": {"steady_throughput": _NUMBER, "steady_epoch_time_s": _NUMBER,
                "final_test_accuracy": _NUMBER, "flops_per_step": _NUMBER, "mfu": _NUMBER},
    "flops": {"peak_measured": (bool,)},
    "study": {"config_id": (str,), "scaling": (str,), "repeat": (int,), "baseline": (bool,),
              "params": {}},
}


def _quote(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run record of this parascale (any status), or :class:`Refused` saying why not.

    A record may come from anywhere (a copy off another machine, a hand edit, a hostile file),
    so it is read within safejson's limits and its types are checked against :data:`RUN_RECORD`.
    """
    data = load(path)
    if not isinstance(data, dict):
        raise Refused("not a parascale run record (not a JSON object)", "invalid")
    schema = data.get("schema")
    if schema != SCHEMA:
        if isinstance(schema, str) and schema.startswith("parascale.run/"):
            raise Refused(f"record schema {_quote(schema)} is not supported (this parascale reads "
                          f"{SCHEMA!r})", "invalid")
        raise Refused(f"not a parascale run record (no \"schema\": \"{SCHEMA}\")", "invalid")
    status = data.get("status")
    if status not in STATUSES:
        raise Refused(f"unknown status {_quote(status)} (expected one of {', '.join(STATUSES)})",
                      "invalid")
    check_types(data, RUN_RECORD)
    return data


def dumps(record: dict[str, Any]) -> str:
    """The record as strict JSON (a non-finite figure is null, with why beside it:
    :func:`parascale.safejson.dumps`)."""
    return safejson.dumps(record, indent=2) + "\n"


def write(out_dir: str | os.PathLike, record: dict[str, Any]) -> Path:
    return atomic_write_text(Path(out_dir) / RECORD_NAME, dumps(record))


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision() -> str | None:
    """The revision of the code that ran: the working folder's, else parascale's own checkout."""
    for where in (os.getcwd(), Path(__file__).resolve().parent):
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                                 text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def environment(backend: str, device_type: str, devices: list[str], hosts: list[str],
                launcher: str, start_time: str) -> dict[str, Any]:
    # imported here: the report reads records without loading torch; torchvision's version from
    # its metadata, because importing it costs a worker that does not use it about 3.5 s
    import importlib.metadata

    import torch

    try:
        vision = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        vision = None

    return {
        "python": platform.python_version(), "torch": torch.__version__,
        "torchvision": vision, "parascale": VERSION,
        "backend": backend, "device_type": device_type, "devices": devices,
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "hosts": sorted(set(hosts)),
        "launcher": launcher, "git_revision": git_revision(), "start_time": start_time,
    }
