"""Parameter server: server processes hold the global model; workers push gradients, pull weights.

``--workers N`` counts training workers; rank 0 starts ``--ps-servers K`` server processes in
addition (:mod:`parascale.sync.ps_server`), so a sync server on N workers trains exactly like
allreduce on N workers. The flat parameter vector is cut into K contiguous shards, one per
server. Workers and servers share a gloo group of their own over a TCPStore hosted by rank 0
(listening on loopback in a local launch, on MASTER_ADDR's address under torchrun or srun); the
workers' default group (epoch statistics, evaluation) never includes a server.

Each step, after backward, a worker sends every server its shard of the gradient with the step's
learning rate and receives the shard's new parameters ("sync" phase: everything from the first
send to the last reply, the servers' update included); ``step`` copies them into the model.
``sync`` mode waits for all workers each step; ``async`` applies each worker's gradient alone,
and the worker records the staleness of that update: how many updates from other workers the
shard received between this worker's pull and its push.

Failure: a server that dies fails the job at once, named by rank 0 (a watch thread there); a
worker that dies takes the servers with it (they die with rank 0, or give up after the timeout).
"""
from __future__ import annotations

import atexit
import datetime
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.runtime import processes
from parascale.runtime.scratch import make_dir, sweep
from parascale.sync import compression
from parascale.sync import ps_protocol as proto
from parascale.sync.base import Strategy
from parascale.sync.flat import Flat, shard_bounds
from parascale.sync.options import option
from parascale.sync.traits import Pattern, Traits

if TYPE_CHECKING:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
else:  # the registry is read without torch: imported on first use
    np = lazy.module("numpy", globals(), "np")
    torch = lazy.module("torch", globals())
    dist = lazy.module("torch.distributed", globals(), "dist")

LOG_TAIL = 8
DEATH_GRACE_S = 2.0  # how long a failed exchange waits to see whether a server died


class ServerProcesses:
    """Rank 0's server processes: started, watched, stopped; never left behind."""

    def __init__(self, specs: list[proto.Spec]):
        sweep(prefixes=("parascale-ps-",))  # logs of servers whose worker was killed
        self.logs = make_dir("parascale-ps-")
        self.procs: list[processes.Child] = []
        self._expected_exit = False
        atexit.register(self.kill)
        # fresh interpreters: this worker has threads (gloo's) and cannot reach the launcher's
        # fork server, so forking here would be unsafe
        for spec in specs:
            env = {**os.environ, proto.ENV: spec.to_env(), "OMP_NUM_THREADS": "1",
                   "MKL_NUM_THREADS": "1"}
            self.procs.append(processes.start_command(
                [sys.executable, "-m", "parascale.sync.ps_server"], env,
                self.logs / f"server{spec.index}.log"))

    def describe(self, k: int, context: str = "") -> str:
        """'parameter server k (pid P) exited with code C[context]; its last output: ...'"""
        proc = self.procs[k]
        state = processes.exit_text(proc.poll())
        tail = processes.tail(self.logs / f"server{k}.log", "", LOG_TAIL)
        return f"parameter server {k} (pid {proc.pid}) {state}{context}" + \
            (f"; its last output: {tail}" if tail else "")

    def dead(self) -> int | None:
        return next((k for k, p in enumerate(self.procs) if p.poll() is not None), None)

    def cause(self, error: RuntimeError, grace_s: float = DEATH_GRACE_S) -> RuntimeError:
        """The server death behind a communication ``error``, named, or ``error`` itself. A
        killed server's sockets close before the kernel reports it dead, so gloo's "connection
        reset" can reach this rank first: wait a moment for the death that explains it."""
        deadline = time.monotonic() + grace_s
        while (dead := self.dead()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return error if dead is None else RuntimeError(self.describe(dead))

    def wait_ready(self, store: dist.Store, timeout_s: float) -> None:
        """Every server has connected to the store, or a clear error (not a silent timeout)."""
        deadline = time.monotonic() + timeout_s
        keys = [f"{proto.PREFIX}ready/{k}" for k in range(len(self.procs))]
        while not store.check(keys):
            dead = self.dead()
            if dead is not None:
                raise RuntimeError(self.describe(dead, " before it started serving"))
            if time.monotonic() > deadline:
                raise RuntimeError(f"parameter servers did not start within {timeout_s:g} s")
            time.sleep(0.02)

    def watch(self) -> None:
        """A server that exits before the workers stop it ends this worker, naming the server."""
        from parascale.runtime.failure import write_error_file

        def run() -> None:
            while not self._expected_exit:
                dead = self.dead()
                if dead is not None and not self._expected_exit:
                    error = RuntimeError(self.describe(dead))
                    write_error_file(error)
                    print(f"parascale: {error}", file=sys.stderr, flush=True)
                    self.kill()
                    os._exit(1)
                time.sleep(0.1)
        threading.Thread(target=run, name="parascale-ps-watch", daemon=True).start()

    def expect_exit(self) -> None:
        self._expected_exit = True

    def join(self, timeout_s: float) -> None:
        """Wait for the servers to finish (they were told to stop); kill what hangs."""
        deadline = time.monotonic() + timeout_s
        try:
            for k, proc in enumerate(self.procs):
                code = proc.wait(max(0.0, deadline - time.monotonic()))
                if code is None:
                    raise RuntimeError(self.describe(
                        k, f" {timeout_s:g} s after it was told to stop"))
                if code != 0:
                    raise RuntimeError(self.describe(k))
        finally:
            self.kill()

    def kill(self) -> None:
        self._expected_exit = True
        processes.stop(self.procs, 0.0)
        shutil.rmtree(self.logs, ignore_errors=True)


@dataclass(frozen=True)
class ParameterServerSettings(compression.CompressionSettings):
    ps_mode: str = option("sync", "Parameter server: sync (wait for every worker each step) or "
                          "async (apply each worker's gradient as it arrives; staleness is "
                          "recorded).", choices=("sync", "async"), flag=True)
    ps_servers: int = option(1, "Parameter server processes, started in addition to the "
                             "workers; parameters are sharded across them.", minimum=1,
                             flag=True)


class ParameterServer(Strategy):
    name = "parameter-server"
    traits = Traits(optimizer="sgd", optimizer_why="updates on the servers with SGD (momentum, "
                    "weight decay) from each gradient as it arrives",
                    script_refusal="its updates run on server processes, not in the script's "
                                   "optimizer")
    Settings = ParameterServerSettings
    settings: ParameterServerSettings

    @classmethod
    def lockstep(cls, settings: ParameterServerSettings) -> bool:
        return settings.ps_mode == "sync"  # the servers wait for every worker

    @classmethod
    def agrees(cls, settings: ParameterServerSettings) -> bool:
        return settings.ps_mode == "sync"  # every worker copies the same reply each step

    @classmethod
    def equivalence(cls, settings: ParameterServerSettings) -> str | None:
        # sync: the servers step on the mean of every worker's gradient; async on each alone
        return compression.exact(settings) if settings.ps_mode == "sync" else None

    @classmethod
    def pattern(cls, settings: ParameterServerSettings) -> Pattern:
        return Pattern(algorithm="server", servers=settings.ps_servers)

    @classmethod
    def refuse(cls, cfg) -> str | None:
        if cfg.strategy.precision == "fp16":
            return ("--precision fp16 does not work with --sync parameter-server (the servers "
                    "apply unscaled fp32 updates); use bf16 or fp32")
        if cfg.optim.clip_grad_norm is not None:
            return ("--sync parameter-server updates on the servers from each gradient as it "
                    "arrives, unclipped; leave out --clip-grad-norm")
        return compression.refuse_unless_elementwise(cls.name, cls.settings_of(cfg))

    @classmethod
    def helper_processes(cls, cfg) -> int:
        return cls.settings_of(cfg).ps_servers

    def wrap(self, model: nn.Module) -> nn.Module:
        from parascale.runtime.rendezvous import LOOPBACK, open_store

        self.model = model
        world, cfg, settings = self.world, self.cfg, self.settings
        self.flat = Flat(model, device=torch.device("cpu"))  # gloo moves CPU tensors
        n, k = world.size, settings.ps_servers
        if k > self.flat.numel:
            raise ValueError(f"--ps-servers {k} is more than the model's {self.flat.numel} "
                             "parameters")
        self.bounds = shard_bounds(self.flat.numel, k)
        self.grads, self.params = self.flat.new(), self.flat.new()
        self.compressor = settings.compressor()  # the gradients; the parameters travel fp32
        self.flat.gather_params(self.params)
        self.versions = [0] * k
        self.staleness: list[int] = []
        self.headers = [torch.zeros(proto.HEADER_SIZE, dtype=torch.float64) for _ in range(k)]
        self.replies = [torch.zeros(1, dtype=torch.float64) for _ in range(k)]
        self.servers: ServerProcesses | None = None
        seconds = cfg.processes.timeout  # a collective's, and the servers' start-up's
        timeout = datetime.timedelta(seconds=seconds)

        # rank 0 hosts the group's store and starts the servers; the others learn the port
        host = LOOPBACK if world.launcher == "local" else \
            os.environ.get("MASTER_ADDR") or world.host
        address: list[Any] = [host, 0]
        if world.is_main:
            store = open_store(host=host, timeout_s=seconds)
            address = [store.host, store.port]  # the host may be replaced by a local address
        dist.broadcast_object_list(address, src=0)
        if world.is_main:
            self.servers = ServerProcesses([
                proto.Spec(store.host, store.port, s, n, k, a, b, settings.ps_mode, seconds,
                           os.getpid(), str(self.flat.dtype).removeprefix("torch."),
                           settings.compression)
                for s, (a, b) in enumerate(self.bounds)])
            self.servers.wait_ready(store, seconds)
            self.servers.watch()
        else:
            store = dist.TCPStore(address[0], address[1], is_master=False, timeout=timeout)
        self._store = store  # the host must keep it alive while the group exists
        self.pg = proto.open_group(store, world.rank, n + k, timeout)
        if world.is_main:
            self._wait([self.pg.send([self.params[a:b]], n + s, proto.INIT)
                        for s, (a, b) in enumerate(self.bounds)])

        # sent by each worker (and the parameters received, fp32: self.flat.bytes)
        self.bytes_per_step = self.compressor.bytes_for(self.flat.numel, self.flat.element_size)
        return model

    def explain(self, error: RuntimeError) -> RuntimeError:
        # rank 0 hosts the servers: a peer's "connection closed" can be a server's death
        return error if self.servers is None else self.servers.cause(error)

    def _wait(self, works) -> None:
        try:
            for work in works:
                work.wait()
        except RuntimeError as error:
            if self.servers is None:
                raise
            cause = self.servers.cause(error)
            if cause is error:
                raise
            raise cause from error

    def _request(self, kind: int, optimizer: torch.optim.Optimizer | None = None) -> None:
        """One message to every server and, unless stopping, its reply into ``self.params``."""
        n = self.world.size
        settings = [0.0] * 5
        if optimizer is not None:
            if len(optimizer.param_groups) != 1:
                raise ValueError("the parameter server supports one optimizer parameter group")
            g = optimizer.param_groups[0]
            settings = [float(g["lr"]), g["momentum"], g["dampening"], g["weight_decay"],
                        float(g["nesterov"])]
        works = []
        wire = self.compressor.compress(self.grads) if kind == proto.PUSH else self.grads
        for s, (a, b) in enumerate(self.bounds):
            header = self.headers[s]
            header[0], header[1] = kind, self.versions[s]
            header[2:] = torch.tensor(settings, dtype=torch.float64)
            works.append(self.pg.send([header], n + s, proto.HEADER))
            if kind == proto.PUSH:
                works.append(self.pg.send([wire[a:b]], n + s, proto.GRAD))
            if kind != proto.STOP:
                works += [self.pg.recv([self.replies[s]], n + s, proto.REPLY),
                          self.pg.recv([self.params[a:b]], n + s, proto.PARAMS)]
        self._wait(works)
        if kind == proto.STOP:
            return
        for s in range(len(self.bounds)):
            version = int(self.replies[s][0])
            if kind == proto.PUSH:  # updates by others between this worker's pull and push
                self.staleness.append(version - self.versions[s] - 1)
            self.versions[s] = version

    def _checkpoint_round(self, kind: int) -> bool:
        """Send ``kind`` (SNAPSHOT or RESTORE) to every server where this worker takes part:
        every worker in sync mode (a round is one kind), worker 0 alone in async mode. Whether
        this worker is the one the servers answer (worker 0)."""
        if self.settings.ps_mode == "async" and not self.world.is_main:
            return False
        if not self.world.is_main:
            for header in self.headers:
                header.zero_()
                header[0] = kind
            self._wait([self.pg.send([h], self.world.size + s, proto.HEADER)
                        for s, h in enumerate(self.headers)])
        return self.world.is_main

    def state_dict(self) -> dict:
        """The versions and staleness this worker saw; on worker 0 also every server's shard,
        momentum buffer and version, fetched with SNAPSHOT (the servers did the updates)."""
        state: dict[str, Any] = {"versions": list(self.versions),
                                 "staleness": list(self.staleness)}
        if not self._checkpoint_round(proto.SNAPSHOT):
            return state
        n, servers = self.world.size, []
        for s, (a, b) in enumerate(self.bounds):
            header = self.headers[s]
            header.zero_()
            header[0] = proto.SNAPSHOT
            facts = torch.zeros(2, dtype=torch.float64)
            param = torch.empty(b - a, dtype=self.flat.dtype)
            self._wait([self.pg.send([header], n + s, proto.HEADER),
                        self.pg.recv([facts], n + s, proto.STATE),
                        self.pg.recv([param], n + s, proto.PARAMS)])
            momentum = None
            if facts[1]:
                momentum = torch.empty_like(param)
                self.pg.recv([momentum], n + s, proto.MOMENTUM).wait()
            servers.append({"version": int(facts[0]), "param": param, "momentum": momentum})
        state["servers"] = servers
        return state

    def load_state_dict(self, state: dict) -> None:
        """Give every server its shard, momentum and version back (RESTORE, from worker 0);
        the model, restored already, is the parameters. The workers wait for worker 0 before
        anyone pushes, so no gradient meets a server that is not restored yet."""
        self.versions = [int(v) for v in state["versions"]]
        self.staleness = [int(v) for v in state["staleness"]]
        self.flat.gather_params(self.params)
        if self._checkpoint_round(proto.RESTORE):
            n = self.world.size
            for s, ((a, b), saved) in enumerate(zip(self.bounds, state["servers"])):
                header = self.headers[s]
                header.zero_()
                header[0], header[1] = proto.RESTORE, saved["version"]
                header[2] = saved["momentum"] is not None
                facts = torch.zeros(2, dtype=torch.float64)
                works = [self.pg.send([header], n + s, proto.HEADER),
                         self.pg.send([saved["param"].to(self.flat.dtype).contiguous()], n + s,
                                      proto.PARAMS)]
                if saved["momentum"] is not None:
                    works.append(self.pg.send([saved["momentum"].contiguous()], n + s,
                                              proto.MOMENTUM))
                self._wait(works + [self.pg.recv([facts], n + s, proto.STATE)])
        dist.barrier()

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        self.flat.gather_grads(self.grads)
        self._request(proto.PUSH, optimizer)

    def step(self, optimizer: torch.optim.Optimizer, scaler: Any | None = None) -> None:
        self.flat.scatter_params(self.params)  # the servers did the update

    def before_evaluation(self) -> None:
        if self.settings.ps_mode == "async":  # every worker evaluates the same, current model
            self._request(proto.PULL)
            self.flat.scatter_params(self.params)
        super().before_evaluation()

    def finish(self) -> None:
        gathered: list[Any] = [None] * self.world.size  # each rank's list, once gathered
        dist.all_gather_object(gathered, self.staleness)
        self._gathered = gathered
        if self.servers is not None:
            self.servers.expect_exit()
        self._request(proto.STOP)
        self.pg.barrier().wait()
        if self.servers is not None:
            # before the record's collective: no worker tears its group down while a server
            # still lives (peers tearing down at the same moment can abort gloo)
            self.servers.join(self.cfg.processes.timeout)

    def options(self) -> dict:
        n = self.world.size
        largest = self.compressor.bytes_for(max(b - a for a, b in self.bounds),
                                            self.flat.element_size)
        return {**super().options(), "server_receives_bytes_per_step": n * largest}

    def measurements(self) -> dict:
        every = [s for ranks in self._gathered for s in ranks]

        def summary(values: list[int]) -> dict | None:
            if not values:
                return None
            array = np.asarray(values, dtype=float)
            return {"count": int(array.size), "mean": float(array.mean()),
                    "p50": float(np.percentile(array, 50)),
                    "p95": float(np.percentile(array, 95)), "max": int(array.max())}

        return {"ps_mode": self.settings.ps_mode, "ps_servers": self.settings.ps_servers,
                "updates_per_server": self.versions[0] if self.versions else 0,
                "staleness": summary(every),
                "staleness_per_rank": [summary(ranks) for ranks in self._gathered]}
