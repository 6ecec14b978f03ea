"""What a study's Slurm job runs after training: file the run into the study folder.

``python -m parascale.cluster.filing STUDY FOLDER JOB_ID EXIT_CODE``: the record rank 0 wrote
into ``STUDY/.running/FOLDER`` is filed as ``bench`` files it (study block added, written
atomically); when there is none, a failed record saying how srun ended and the last error line
of the job's output. Then the ``.filed`` marker names this job, so ``status`` knows the record
in ``runs/FOLDER`` is this job's.
"""
from __future__ import annotations

import sys
from pathlib import Path

from parascale.bench.runner import StudyRunner, planned_jobs
from parascale.cluster.study import mark_filed, output_path


def last_error(output: Path) -> str | None:
    """The last line of ours that says what went wrong, from the job's output."""
    try:
        lines = output.read_text(errors="replace").splitlines()[-400:]
    except OSError:
        return None
    for line in reversed(lines):
        text = line.strip()
        if text.startswith(("parascale: error:", "parascale: failed:")) or "srun: error:" in text:
            return text[:500]
    return None


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
    if len(argv) != 4 or not argv[3].lstrip("-").isdigit():
        print("usage: python -m parascale.cluster.filing STUDY FOLDER JOB_ID EXIT_CODE",
              file=sys.stderr)
        return 2
    status = file_run(Path(argv[0]), argv[1], argv[2], int(argv[3]))
    print(f"parascale: filed {argv[1]} ({status}) in {argv[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
