"""Talking to Slurm: submit a script, and find out how a job is doing or how it ended.

Where a job's final state comes from, in order (docs/slurm.md):

1. ``scontrol show job``: slurmctld remembers every job while it is queued or running, and for
   ``MinJobAge`` seconds (300 by default) after it ended, with its state and reason.
2. ``sacct``: the accounting database, where the cluster has one (this project's CI cluster has
   no slurmdbd, and sacct says "accounting storage is disabled").
3. The job's output file: when slurmstepd kills a job it writes a line such as
   ``*** JOB 12 ON node CANCELLED AT 2026-... DUE TO TIME LIMIT ***`` into it.

A job none of these knows is reported as ``UNKNOWN``; the study's own marker (written by the job
once its record is filed, see :mod:`.filing`) settles whether it finished.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from parascale.errors import UsageError

ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                    "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "STAGE_OUT",
                    "SIGNALING", "RESV_DEL_HOLD", "STOPPED"})
FAILED = frozenset({"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
TIMEOUT_S = 30.0  # a scheduler command that takes longer is a scheduler in trouble
_KILLED_RE = re.compile(r"\*\*\* JOB (\d+) ON \S+ CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))?"
                        r"(?: \*\*\*|$)")


@dataclass
class JobState:
    """A job as the scheduler (or its output) tells it."""

    job_id: str
    state: str  # Slurm's word: PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ..., or UNKNOWN
    reason: str = ""  # Slurm's reason (why pending, why it failed), exit code included
    source: str = ""  # scontrol | sacct | output | none

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def failed(self) -> bool:
        return self.state in FAILED

    def describe(self) -> str:
        """'TIMEOUT (TimeLimit, exit code 0:15)': the state with Slurm's own reason."""
        return f"{self.state} ({self.reason})" if self.reason else self.state


def available() -> str | None:
    """Why jobs cannot be submitted here, or None when sbatch is on the PATH."""
    if shutil.which("sbatch") is None:
        return "sbatch is not on the PATH (no Slurm client here)"
    return None


def _run(argv: list[str], input_text: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, input=input_text, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except FileNotFoundError:
        raise UsageError(f"{argv[0]} is not on the PATH: run parascale slurm where Slurm's "
                         "commands are (a login node)") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{argv[0]} did not answer within {TIMEOUT_S:.0f} s: is slurmctld "
                         "up? (sinfo says)") from None


def submit(script_path: Path) -> str:
    """Submit a job script with sbatch; the job id. sbatch's refusal is one line, and the
    script, written just before, is removed: it never was a job."""
    done = _run(["sbatch", "--parsable", str(script_path)])
    if done.returncode != 0:
        script_path.unlink(missing_ok=True)
        message = " ".join(done.stderr.split()) or f"exit code {done.returncode}"
        raise UsageError(f"sbatch refused {script_path}: {message}")
    job_id = done.stdout.strip().split(";")[0]  # --parsable: id[;cluster]
    if not (job_id.isascii() and job_id.isdigit()):
        raise UsageError(f"sbatch said {done.stdout.strip()!r}, not a job id")
    return job_id


def states(job_ids: list[str], outputs: dict[str, Path] | None = None) -> dict[str, JobState]:
    """The state of each job, from the best source that knows it (see the module docstring).
    ``outputs`` maps a job id to its output file, read for jobs the scheduler forgot."""
    found = _scontrol(job_ids)
    missing = [j for j in job_ids if j not in found]
    if missing:
        found.update(_sacct(missing))
    for job_id in job_ids:
        if job_id not in found:
            path = (outputs or {}).get(job_id)
            found[job_id] = _from_output(job_id, path) or JobState(job_id, "UNKNOWN",
                                                                   source="none")
    return found


def _scontrol(job_ids: list[str]) -> dict[str, JobState]:
    """Every job slurmctld still remembers, in one call ('-o': one line per job)."""
    if not job_ids:
        return {}
    done = _run(["scontrol", "-o", "show", "job"])
    if done.returncode != 0:
        return {}
    wanted, found = set(job_ids), {}
    for line in done.stdout.splitlines():
        fields = dict(_pairs(line))
        job_id = fields.get("JobId", "")
        if job_id in wanted:
            found[job_id] = JobState(job_id, fields.get("JobState", "UNKNOWN"),
                                     _reason(fields.get("Reason", "None"),
                                             fields.get("ExitCode", "0:0")), "scontrol")
    return found


def _pairs(line: str):
    """key=value pairs of one 'scontrol -o' line (values have no spaces, except Command's
    and a few paths, which follow a key of their own and are not read here)."""
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            yield key, value


def _reason(reason: str, exit_code: str) -> str:
    parts = [] if reason in ("None", "") else [reason]
    if exit_code not in ("0:0", ""):
        parts.append(f"exit code {exit_code}")
    return ", ".join(parts)


def _sacct(job_ids: list[str]) -> dict[str, JobState]:
    """What the accounting database says, where there is one; nothing otherwise."""
    if shutil.which("sacct") is None:
        return {}
    done = _run(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,Reason",
                 "-j", ",".join(job_ids)])
    if done.returncode != 0:  # "Slurm accounting storage is disabled"
        return {}
    found = {}
    for line in done.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 4 and parts[0] in job_ids:
            state = parts[1].split()[0]  # "CANCELLED by 0" -> CANCELLED
            found[parts[0]] = JobState(parts[0], state, _reason(parts[3], parts[2]), "sacct")
    return found


def _from_output(job_id: str, path: Path | None) -> JobState | None:
    """The kill line slurmstepd writes into a job's output, when the job was killed."""
    if path is None or not path.is_file():
        return None
    try:
        with open(path, "rb") as handle:  # the end of the file is where the kill line is
            handle.seek(max(0, path.stat().st_size - 65536))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        match = _KILLED_RE.search(line)
        if match and match.group(1) == job_id:
            why = (match.group(3) or "").strip()
            state = {"TIME LIMIT": "TIMEOUT", "NODE FAILURE": "NODE_FAIL",
                     "PREEMPTION": "PREEMPTED"}.get(why, "CANCELLED")
            return JobState(job_id, state, match.group(0).strip("* "), "output")
    return None


def cancel(job_id: str) -> None:
    _run(["scancel", job_id])


def cpus_per_node(partition: str | None) -> int | None:
    """The CPUs of the smallest node of ``partition`` (the default one), from sinfo; None where
    there is no sinfo to ask."""
    if shutil.which("sinfo") is None:
        return None
    argv = ["sinfo", "-h", "-o", "%c"] + (["-p", partition] if partition else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    counts = [int(v.rstrip("+")) for v in done.stdout.split()
              if v.rstrip("+").isascii() and v.rstrip("+").isdigit()]
    return min(counts) if done.returncode == 0 and counts else None
