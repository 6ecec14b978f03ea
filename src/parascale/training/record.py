"""The run record: environment facts, assembly, and the atomic write (schema in docs/record.md)."""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

import parascale
from parascale.files import atomic_write_text
from parascale.safejson import RECORD_SCHEMA as SCHEMA  # one spelling for writer and readers
RECORD_NAME = "record.json"
MODEL_NAME = "model.pt"  # beside the record when the run saved its model


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
    for where in (os.getcwd(), Path(parascale.__file__).resolve().parent):
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
    import torchvision

    return {
        "python": platform.python_version(), "torch": torch.__version__,
        "torchvision": torchvision.__version__, "parascale": parascale.__version__,
        "backend": backend, "device_type": device_type, "devices": devices,
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "hosts": sorted(set(hosts)),
        "launcher": launcher, "git_revision": git_revision(), "start_time": start_time,
    }


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=2) + "\n"


def write(out_dir: str | os.PathLike, record: dict[str, Any]) -> Path:
    return atomic_write_text(Path(out_dir) / RECORD_NAME, dumps(record))


def failure_record(config: dict[str, Any], status: str, reason: str, derived: dict | None,
                   environment_: dict | None = None, detail: str | None = None) -> dict[str, Any]:
    """A record for a run that did not finish: never claims success, always says why.

    ``detail`` is the failing rank's traceback: the user sees the one-line ``reason``, and
    whoever needs more finds it here."""
    return {"schema": SCHEMA, "status": status, "reason": reason, "detail": detail,
            "config": config, "derived": derived, "environment": environment_, "epochs": [],
            "steps": None, "memory": None, "time_to_accuracy": None, "sync": None,
            "machine": None, "timing": None, "summary": None, "study": None}
