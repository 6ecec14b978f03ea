"""One rank of ``parascale comm``: ``python -m parascale.comm.worker`` or a torchrun process."""
from __future__ import annotations

import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from parascale import safejson
from parascale.comm.config import (ELEMENT_BYTES, RECORD_NAME, SCHEMA, CommConfig, bus_factor,
                                   iterations_for)
from parascale.files import atomic_write_text
from parascale.runtime import contract
from parascale.runtime import World, joined, resolve_backend, resolve_device_type
from parascale.runtime.failure import serve_as_worker
from parascale.record import environment, now

METHOD = ("per operation and size: warm-up iterations, then timed iterations (each one from "
          "its call to its completion, with the device synchronised on GPUs); time_s is the "
          "largest over ranks of each rank's median iteration; algbw = bytes / time_s; "
          "mean_s: the same with each rank's mean iteration; "
          "busbw = algbw * bus_factor (nccl-tests); all_gather bytes = the gathered output")


class Collective:
    """One operation at one size: its buffers, made once, and a call that runs it once."""

    def __init__(self, op: str, size: int, world: World):
        n, device = world.size, world.device
        count = max(1, size // ELEMENT_BYTES)
        self.op = op
        if op == "all_gather":
            per_rank = max(1, count // n)
            self.input = torch.ones(per_rank, device=device)
            self.output = torch.empty(per_rank * n, device=device)
            self.bytes = per_rank * n * ELEMENT_BYTES
        else:
            self.input = torch.ones(count, device=device)
            self.bytes = count * ELEMENT_BYTES

    def __call__(self) -> None:
        if self.op == "allreduce":
            dist.all_reduce(self.input)
        elif self.op == "broadcast":
            dist.broadcast(self.input, src=0)
        elif self.op == "reduce":
            dist.reduce(self.input, dst=0)
        else:
            dist.all_gather_single(self.output, self.input)


def _timed(call, cuda: bool) -> float:
    start = time.perf_counter()
    call()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _max_over_ranks(value: float, device: torch.device) -> float:
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor)


def measure(cfg: CommConfig, world: World) -> list[dict]:
    cuda = world.device.type == "cuda"
    results = []
    for op in cfg.ops:
        for size in cfg.sizes:
            collective = Collective(op, size, world)
            warm = [_timed(collective, cuda) for _ in range(max(1, cfg.warmup))]
            # every rank must run the same number of iterations: agree on the slowest estimate
            iterations = iterations_for(_max_over_ranks(warm[-1], world.device), cfg)
            dist.barrier()
            timed = [_timed(collective, cuda) for _ in range(iterations)]
            # the median is the link; the mean is what a training step pays on average, the
            # iterations a busy machine preempted included (predict fits to it)
            mine = [statistics.median(timed), statistics.fmean(timed)]
            per_rank = [torch.zeros(2, dtype=torch.float64, device=world.device)
                        for _ in range(world.size)]
            dist.all_gather(per_rank, torch.tensor(mine, dtype=torch.float64,
                                                   device=world.device))
            times = [float(t[0]) for t in per_rank]
            means = [float(t[1]) for t in per_rank]
            slowest = max(times)
            factor = bus_factor(op, world.size)
            algbw = collective.bytes / slowest if slowest > 0 else 0.0
            results.append({"op": op, "bytes": collective.bytes, "dtype": "float32",
                            "iterations": iterations, "warmup": max(1, cfg.warmup),
                            "time_s": slowest, "time_s_per_rank": times,
                            "mean_s": max(means), "mean_s_per_rank": means,
                            "algbw_bytes_per_s": algbw, "bus_factor": factor,
                            "busbw_bytes_per_s": algbw * factor})
            del collective
    return results


def run_worker(cfg: CommConfig, teardown: bool = True) -> dict | None:
    device_type = resolve_device_type("cuda" if cfg.gpus else "auto", cfg.gpus)
    backend = resolve_backend("auto", device_type)
    with joined(device_type, backend, cfg.gpus, cfg.timeout, teardown) as world:
        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        started = now()
        results = measure(cfg, world)
        where = torch.cuda.get_device_name(world.device) if device_type == "cuda" else "cpu"
        places: list[tuple[str, str]] = [None] * world.size  # type: ignore[list-item]
        dist.all_gather_object(places, (socket.gethostname(), where))
        if not world.is_main:
            return None
        hosts, devices = [p[0] for p in places], [p[1] for p in places]
        record = {"schema": SCHEMA, "status": "ok", "world_size": world.size,
                  "config": cfg.to_dict(),
                  "environment": environment(world.backend, device_type, devices, hosts,
                                             world.launcher, started),
                  "method": METHOD, "results": results}
        if cfg.out:
            atomic_write_text(Path(cfg.out) / RECORD_NAME,
                              safejson.dumps(record, indent=2) + "\n")
        return record


if __name__ == "__main__":
    config = CommConfig.from_dict(json.loads(os.environ[contract.COMM_CONFIG]))
    serve_as_worker(lambda: run_worker(config, teardown=False))
