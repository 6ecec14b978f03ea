"""Facts of this process's place: who started it and the cores it may use, read without
importing torch (so that a command can decide to start the fork server before importing it)."""
from __future__ import annotations

import os

from parascale.runtime import contract

LOCAL_ENV = contract.STORE_PORT


def external_launcher() -> str | None:
    """'torchrun' or 'slurm' when this process belongs to a world started by someone else."""
    if os.environ.get(LOCAL_ENV):
        return None
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "torchrun"
    # srun sets SLURM_PROCID for every task; SLURM_STEP_ID tells srun from the batch script itself
    if "SLURM_PROCID" in os.environ and "SLURM_STEP_ID" in os.environ \
            and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return "slurm"
    return None


def speaks() -> bool:
    """Whether this process says what is wrong with the input: any process but the non-zero
    ranks of a torchrun or srun world. Every rank there checks the same input (a --data-dir
    only the compute nodes mount, missing on them too) and would print the same line."""
    launcher = external_launcher()
    if launcher is None:
        return True
    return os.environ.get("RANK" if launcher == "torchrun" else "SLURM_PROCID", "0") == "0"


def external_size() -> int:
    """World size announced by torchrun or srun."""
    return int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)


def available_cores() -> int:
    """CPU cores this process may run on (respects taskset/cgroup affinity, unlike cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cores_per_worker(workers: int) -> int:
    """This machine's cores shared among ``workers`` processes, at least one each."""
    return max(1, available_cores() // workers)


# What the local launcher tells a worker about checkpoints, its console log and its attempt
# (torchrun and srun workers find their checkpoints and log in --out and their attempt below).
# (the names are the contract's, runtime/contract.py)
CHECKPOINTS_ENV = contract.CHECKPOINTS
LOG_ENV = contract.LOG
RESUME_ENV = contract.RESUME
ATTEMPT_ENV = contract.ATTEMPT
TORCHRUN_RESTARTS_ENV = "TORCHELASTIC_RESTART_COUNT"


def attempt() -> int:
    """Which start of the workers this is: 0 the first, k after the k-th restart (by
    parascale's local launcher, or by torchrun's elastic agent)."""
    text = os.environ.get(ATTEMPT_ENV) if os.environ.get(LOCAL_ENV) else \
        os.environ.get(TORCHRUN_RESTARTS_ENV)
    try:
        return max(0, int(text or 0))
    except ValueError:
        return 0


def restarted_by_torchrun() -> bool:
    """torchrun's agent started these workers again after a failure (its --max-restarts)."""
    return external_launcher() == "torchrun" and attempt() > 0
