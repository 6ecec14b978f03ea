"""The distributed world as one worker sees it: rank, size, device, backend, and how it started.

Three ways in, one result:

- ``local``: parascale's own launcher started this process; it passes ``PARASCALE_*`` variables
  and hosts the rendezvous store itself (so no free-port race), see :mod:`.local`.
- ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` are set.
- ``slurm``: started by ``srun`` without torchrun: ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``
  map to rank, size and local rank; ``MASTER_ADDR`` must be exported by the job script, and
  ``MASTER_PORT`` too unless the one derived from the job id will do (``parascale slurm`` renders one, see :mod:`parascale.cluster.script`). The task count
  is checked against nodes x tasks per node (and the GPUs a node shows) before anyone joins, and
  rank 0 hosts the store itself on MASTER_ADDR alone (torch's env:// server would listen on
  every interface).

The device is chosen *before* the process group starts (NCCL binds a communicator to the current
device), from ``LOCAL_RANK`` or from the GPU list of a local launch: never a hard-coded ``cuda:0``.
"""
from __future__ import annotations

import contextlib
import contextvars
import datetime
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from parascale import lazy
from parascale.digits import is_count  # not isdigit(): it takes '５', which int() reads
from parascale.errors import UsageError
from parascale.runtime import contract
from parascale.runtime.env import LOCAL_ENV, attempt, external_launcher
from parascale.runtime.rendezvous import LOOPBACK, open_store

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
else:  # devices_elsewhere and the checks of --device, --gpus and --backend run without torch
    torch = lazy.module("torch", globals())
    dist = lazy.module("torch.distributed", globals())


@dataclass
class World:
    """This process's place in the job. ``device`` is where its model and batches live."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    backend: str
    launcher: str  # local | torchrun | slurm
    host: str = field(default_factory=socket.gethostname)

    @property
    def is_main(self) -> bool:
        """Rank 0 speaks: it prints, shows progress and writes the record."""
        return self.rank == 0


#: set while planning for another machine (``bench --dry-run``): GPUs are not looked for here
_ELSEWHERE = contextvars.ContextVar("parascale_devices_elsewhere", default=False)


@contextlib.contextmanager
def devices_elsewhere() -> Iterator[None]:
    """Check configurations as if their GPUs existed: a study file for a GPU machine is
    planned here, every other check included, and runs as it is there."""
    token = _ELSEWHERE.set(True)
    try:
        yield
    finally:
        _ELSEWHERE.reset(token)


def resolve_device_type(requested: str, gpus: tuple[int, ...] | None,
                        instead: str = "use --workers N to train on CPU cores") -> str:
    """'cpu' or 'cuda' from --device and --gpus; CUDA asked for but absent is a usage error,
    which ends with ``instead``: what to do on the CPU, in the command's own options."""
    wants_cuda = requested == "cuda" or gpus is not None or (
        requested == "auto" and external_launcher() is not None and torch.cuda.is_available())
    if not wants_cuda:
        return "cpu"
    if _ELSEWHERE.get():
        return "cuda"
    if not torch.cuda.is_available():
        what = f"--gpus {','.join(map(str, gpus))}" if gpus else "--device cuda"
        raise UsageError(f"{what} needs CUDA, but torch.cuda.is_available() is False on this "
                         f"machine; {instead}")
    if gpus:
        count = torch.cuda.device_count()
        bad = [g for g in gpus if g >= count]
        if bad:
            raise UsageError(f"--gpus {','.join(map(str, gpus))} asks for GPU {bad[0]}, but only "
                             f"{count} GPU(s) are visible (0..{count - 1})")
    return "cuda"


def resolve_backend(requested: str, device_type: str) -> str:
    """gloo on CPU, NCCL on CUDA; NCCL for CPU tensors cannot work, so say so before starting."""
    if requested == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if requested == "nccl" and device_type != "cuda":
        raise UsageError("--backend nccl needs CUDA devices (NCCL cannot move CPU tensors); "
                         "use --backend gloo or --gpus")
    if requested == "nccl" and not dist.is_nccl_available():
        raise UsageError("--backend nccl: this torch build has no NCCL; use --backend gloo")
    return requested


def _positions() -> tuple[int, int, int, str]:
    """(rank, size, local rank, launcher) from whichever launcher started us."""
    env = os.environ
    if env.get(LOCAL_ENV):
        return int(env[contract.RANK]), int(env[contract.WORLD_SIZE]), \
            int(env[contract.LOCAL_RANK]), "local"
    launcher = external_launcher()
    if launcher == "torchrun":
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)), launcher
    if launcher == "slurm":
        if "MASTER_ADDR" not in env:
            raise UsageError("under srun without torchrun, export MASTER_ADDR in the job script "
                             "(the first node's host name; 127.0.0.1 for one node)")
        return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), \
            int(env.get("SLURM_LOCALID", 0)), launcher
    return 0, 1, 0, "local"


def check_tasks(env: dict[str, str] | os._Environ, device_type: str, visible_gpus: int) -> None:
    """Refuse an srun world whose task count is not nodes x tasks per node, or whose node runs
    more tasks than it shows GPUs: either would leave ranks waiting for peers that never come
    (or two ranks on one GPU), a classic cause of hung Slurm jobs. Read from the environment
    srun gives every task; a variable Slurm did not set is not checked."""
    tasks = int(env.get("SLURM_NTASKS", "1"))
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    if per_node and is_count(per_node) and tasks != nodes * int(per_node):
        raise UsageError(f"srun started {tasks} tasks, but the job has {nodes} node(s) x "
                         f"{per_node} tasks per node = {nodes * int(per_node)}; give srun "
                         "--ntasks equal to --nodes x --ntasks-per-node")
    here = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", ""))
    node = int(env.get("SLURM_NODEID", "0"))
    local = _tasks_on_node(here, node)
    if device_type == "cuda" and local is not None and local > visible_gpus:
        raise UsageError(f"srun runs {local} tasks on node {env.get('SLURMD_NODENAME', node)}, "
                         f"which shows {visible_gpus} GPU(s): one task per GPU, so ask for "
                         f"--ntasks-per-node {visible_gpus} or --gpus-per-node {local}")


def _tasks_on_node(spec: str, node: int) -> int | None:
    """The task count of node ``node`` in Slurm's compressed list, e.g. '2(x3),1'."""
    counts: list[int] = []
    for part in filter(None, spec.split(",")):
        count, _, times = part.partition("(x")
        times = times.removesuffix(")") if times else "1"
        if not (is_count(count) and is_count(times)):
            return None
        counts += [int(count)] * int(times)
    return counts[node] if node < len(counts) else None


PORT_BASE = 15000


def slurm_port(job_id: int) -> int:
    """The rendezvous port of Slurm job ``job_id``: every task derives it alone (they cannot
    agree by talking before the store exists). 15000-29999 is below Linux's ephemeral range
    (32768-), so no outgoing connection holds it; two jobs on one node collide only when their
    ids differ by a multiple of 15000. The job script exports it as MASTER_PORT; a task that
    was given none uses it as well."""
    return PORT_BASE + job_id % PORT_BASE


def _slurm_store(rank: int, size: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """Rank 0 hosts the store on MASTER_ADDR alone (loopback in a one-node job); the others
    connect to it as clients."""
    host = os.environ["MASTER_ADDR"]
    port = int(os.environ.get("MASTER_PORT") or slurm_port(int(os.environ["SLURM_JOB_ID"])))
    if rank == 0:
        return open_store(port, host=host, timeout_s=timeout.total_seconds())
    return dist.TCPStore(host, port, world_size=size, is_master=False, timeout=timeout)


def join(device_type: str, backend: str, gpus: tuple[int, ...] | None,
         timeout_s: float) -> World:
    """Set the device, then start the process group with an explicit timeout.

    torch's defaults (30 min for gloo, 10 for NCCL) would leave a job hanging long after one
    worker died; ``timeout_s`` bounds every collective instead.
    """
    rank, size, local_rank, launcher = _positions()
    if launcher == "slurm":
        check_tasks(os.environ, device_type,
                    torch.cuda.device_count() if device_type == "cuda" else 0)
    if launcher != "local" and threading.current_thread() is threading.main_thread():
        # torchrun and srun stop their ranks with SIGTERM, maybe inside a collective, where the
        # command line's handler (parascale.interrupts) would never run: die at once, as before
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if device_type == "cuda":
        index = gpus[local_rank] if gpus else local_rank
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _store(launcher, rank, size, timeout)
    how = {"store": store} if store is not None else {"init_method": "env://"}
    # NCCL binds its communicator to the device at once under torchrun and srun; a local
    # launch has always joined without device_id
    bound = device if backend == "nccl" and launcher != "local" else None
    dist.init_process_group(backend, **how, rank=rank, world_size=size, timeout=timeout,
                            device_id=bound)
    return World(rank, size, local_rank, device, backend, launcher)


def _store(launcher: str, rank: int, size: int,
           timeout: datetime.timedelta) -> dist.Store | None:
    """The store this rank joins through: the local launcher's, rank 0's under srun, torchrun's
    agent's; None for torch's own env:// (torchrun sharing no store with its workers)."""
    if launcher == "local":
        return dist.TCPStore(LOOPBACK, int(os.environ[LOCAL_ENV]), is_master=False,
                             timeout=timeout)
    if launcher == "slurm":
        return _slurm_store(rank, size, timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return _agent_store(timeout)
    return None


def _agent_store(timeout: datetime.timedelta) -> dist.Store:
    """torchrun's own store, with a key prefix per attempt. The agent shares its rendezvous
    store with the workers and keeps it across its restarts, and torch's ``env://`` no longer
    prefixes the workers' keys by attempt: a restarted attempt read the failed one's gloo
    addresses from it and could not connect (pytorch/pytorch#135712)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    return dist.PrefixStore(f"/parascale/attempt_{attempt()}", store)


def leave() -> None:
    """Tear the process group down so that the next run in this process starts clean."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def joined(device_type: str, backend: str, gpus: tuple[int, ...] | None, timeout_s: float,
           teardown: bool = True) -> Iterator[World]:
    """The world for the body of one worker; on success every rank meets before any leaves.

    ``teardown=False`` leaves the process group standing, for a process that exits right after
    with ``os._exit`` (see :func:`parascale.runtime.failure.serve_as_worker`): gloo can abort a
    rank (SIGABRT, "terminate called without an active exception") whose peer closes its sockets
    while it is still tearing down, even after a barrier, about once in fifty runs here. A
    process that keeps running must tear down. No barrier after a failure: a peer may be dead.
    """
    world = join(device_type, backend, gpus, timeout_s)
    try:
        yield world
        dist.barrier()
    finally:
        if teardown:
            leave()
