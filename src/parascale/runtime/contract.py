"""Every ``PARASCALE_*`` environment variable, named once: the contract between a process that
starts others (the launcher, a study, a search, a strategy's helpers) and the processes it
starts. Both sides read the names from this table; no other module spells one
(tests/test_layers.py checks it). Values are plain strings, JSON where they carry a structure.

Nothing is imported here, so that any process (the fork server, a probe, a trial) can read the
table before it imports torch.
"""
from __future__ import annotations

# --- a local launch: parascale's launcher -> each worker (runtime/local.py -> runtime/world.py)
#: the port of the launcher's rendezvous store on loopback; its presence marks a local worker
STORE_PORT = "PARASCALE_STORE_PORT"
RANK = "PARASCALE_RANK"
WORLD_SIZE = "PARASCALE_WORLD_SIZE"
LOCAL_RANK = "PARASCALE_LOCAL_RANK"
#: where a failing worker leaves its one-line report (runtime/failure.py)
ERROR_FILE = "PARASCALE_ERROR_FILE"
#: 0 for the first start, k after the k-th restart (--max-restarts)
ATTEMPT = "PARASCALE_ATTEMPT"
#: the memory cgroup folder a worker enters before it allocates (--device-memory: memory_cap.py)
MEMORY_CGROUP = "PARASCALE_MEMORY_CGROUP"

# --- a training job: train() -> training/launch/worker.py
#: JSON: the resolved TrainConfig (workers and the staging --out filled in)
CONFIG = "PARASCALE_CONFIG"
#: JSON: the step plan the launcher made from the data it checked (batch.Plan.to_dict)
PLAN = "PARASCALE_PLAN"
#: the data set the launcher built, saved once for its workers (data/handover.py)
DATA_FILE = "PARASCALE_DATA_FILE"
#: the real DIR/checkpoints (the workers write into a staging folder)
CHECKPOINTS = "PARASCALE_CHECKPOINTS"
#: the console log rank 0 appends to
LOG = "PARASCALE_LOG"
#: JSON: the checkpoint to continue from, and why (training/checkpoint/resume.py)
RESUME = "PARASCALE_RESUME"

# --- a user's script: ``parascale run`` -> its copies (cli/run_cmd.py -> parascale/script/)
#: JSON: the script's path and arguments, and the run's resolved TrainConfig (its --sync, its
#: options, the staging --out); absent when the script runs as a plain process
SCRIPT = "PARASCALE_SCRIPT"

# --- a process -> every process it starts (parascale/sync/__init__.py)
#: JSON: ["module:qualname", ...], the strategies registered from outside parascale
#: (``sync.register``), which a process imports and registers with its own registry
STRATEGIES = "PARASCALE_STRATEGIES"

# --- faults injected on purpose, by tests and by hand (runtime/faults.py); the user sets it
FAULT = "PARASCALE_FAULT"

# --- helpers and side processes
#: JSON: one parameter server's task (sync/ps_protocol.py)
PS_SERVER = "PARASCALE_PS_SERVER"
#: JSON: a communication benchmark's configuration (comm/)
COMM_CONFIG = "PARASCALE_COMM_CONFIG"
#: JSON: one batch-size probe's task (batchfind/probe.py)
PROBE = "PARASCALE_PROBE"
#: JSON: a hyperparameter trial's configuration and cores (hpo/trial.py)
TRIAL = "PARASCALE_TRIAL"
#: JSON: how a trial's rank 0 reports to the search and is pruned (training/loop/pruning.py)
PRUNER = "PARASCALE_PRUNER"


def names() -> dict[str, str]:
    """The table: each constant's Python name and the variable it names."""
    return {key: value for key, value in globals().items()
            if key.isupper() and isinstance(value, str) and value.startswith("PARASCALE_")}
