"""What a study's Slurm job runs after training: file the run into the study folder.

``python -m parascale.cluster.filing STUDY FOLDER JOB_ID EXIT_CODE``: the record rank 0 wrote
into ``STUDY/.running/FOLDER`` is filed as ``bench`` files it (study block added, written
atomically); when there is none, a failed record saying how srun ended and the last error line
of the job's output. Then the ``.filed`` marker names this job, so ``status`` knows the record
in ``runs/FOLDER`` is this job's.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from parascale.bench.runner import StudyRunner, planned_jobs
from parascale.cluster.study import mark_filed, output_path


_TASK_RE = re.compile(r"srun: error: \S+: task (\d+): (.*)")


def last_error(output: Path) -> str | None:
    """What went wrong, from the job's output: our own one-line error if a task printed one,
    else the first task srun saw fail (the others are usually killed because of it) with the
    last exception line that rank printed."""
    try:
        lines = output.read_text(errors="replace").splitlines()[-2000:]
    except OSError:
        return None
    ours = [line.strip() for line in lines
            if line.strip().startswith(("parascale: error:", "parascale: failed:"))]
    if ours:
        return ours[-1][:500]
    task = next((m for m in map(_TASK_RE.search, lines) if m), None)
    if task is None:
        return None
    prefix = f"[rank{task.group(1)}]: "
    said = [line[len(prefix):] for line in lines
            if line.startswith(prefix) and line[len(prefix):][:1].isalpha()]
    return (f"task {task.group(1)}: {task.group(2)}" + (f": {said[-1]}" if said else ""))[:500]


def file_run(study: Path, folder: str, job_id: str, code: int) -> str:
    """File ``folder``'s run; its status."""
    jobs = [job for job in planned_jobs(study) if job.folder == folder]
    if not jobs:
        raise SystemExit(f"parascale: error: {folder} is not a configuration of {study}'s plan")
    output = output_path(study, folder, job_id)
    detail = last_error(output)
    reason = (f"Slurm job {job_id}: srun exited with code {code}"
              + (f": {detail}" if detail else "") + f"; output in {output}")
    record = StudyRunner(study, jobs).file_elsewhere(jobs[0], reason)
    mark_filed(study, folder, job_id)
    return record["status"]


def main(argv: list[str]) -> int:
    if len(argv) != 4 or not re.fullmatch(r"-?[0-9]+", argv[3]):
        print("usage: python -m parascale.cluster.filing STUDY FOLDER JOB_ID EXIT_CODE",
              file=sys.stderr)
        return 2
    status = file_run(Path(argv[0]), argv[1], argv[2], int(argv[3]))
    print(f"parascale: filed {argv[1]} ({status}) in {argv[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
