"""One parameter server process: ``python -m parascale.sync.ps_server`` (rank 0 starts them).

Server k of K owns shard k of the flattened parameters (and its momentum buffer) and talks to
the N workers over a gloo group of their own (:mod:`.ps_protocol`), kept apart from the
workers' default group so that the trainer's collectives never wait on a server.

``sync``: each round the server waits for a header from every worker; on PUSH it averages the N
gradients (summed in rank order, divided by N), takes one SGD step and sends the new shard to
all; on PULL it sends the shard; on STOP it leaves; on SNAPSHOT and RESTORE (checkpoints) it
gives worker 0 its shard and momentum, or takes them from it. ``async``: one thread per worker receives
that worker's requests; each pushed gradient is divided by N (its weight in the synchronous
average) and applied at once under a lock, and only that worker gets the fresh shard back.

The update is torch.optim.SGD's, operation for operation, so a sync server on N workers
reproduces allreduce on N workers. The process dies with its parent (PR_SET_PDEATHSIG on Linux,
a watch thread elsewhere) and gives up when a worker is silent for longer than the timeout.
"""
from __future__ import annotations

import datetime
import os
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from parascale.runtime import processes
from parascale.sync import compression
from parascale.sync.ps_protocol import (CHECKPOINT_KINDS, GRAD, HEADER, HEADER_SIZE, INIT,
                                        PARAMS, PREFIX, PUSH, REPLY, STOP, Group, Shard, Spec,
                                        open_group)


def _die_with_parent(parent_pid: int) -> None:
    """A server must never outlive the worker that started it, however that worker ends."""
    if not processes.die_with_parent():
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(1)
        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _wait(works) -> None:
    for work in works:
        work.wait()


def _wire(shard: Shard, squeeze: compression.Compressor) -> torch.Tensor:
    """A receive buffer for one pushed gradient shard, in the type the workers send."""
    return torch.empty_like(shard.param, dtype=squeeze.wire_dtype(shard.param.dtype))


def serve_sync(pg: Group, shard: Shard, workers: int, squeeze: compression.Compressor) -> None:
    headers = [torch.empty(HEADER_SIZE, dtype=torch.float64) for _ in range(workers)]
    grads = [_wire(shard, squeeze) for _ in range(workers)]
    total = torch.empty_like(shard.param)
    reply = torch.empty(1, dtype=torch.float64)
    while True:
        _wait([pg.recv([headers[w]], w, HEADER) for w in range(workers)])
        kinds = {int(h[0]) for h in headers}
        if len(kinds) != 1:
            raise RuntimeError(f"sync parameter server got requests of kinds {sorted(kinds)} "
                               "in one round; every worker must push, pull or stop together")
        kind = kinds.pop()
        if kind == STOP:
            return
        if kind in CHECKPOINT_KINDS:  # with worker 0 alone; the others only sent the header
            shard.checkpoint(pg, kind, headers[0])
            continue
        if kind == PUSH:
            _wait([pg.recv([grads[w]], w, GRAD) for w in range(workers)])
            squeeze.decompress(grads[0], total)
            for grad in grads[1:]:  # rank order: the same sum on every run
                total.add_(grad)
            total.div_(workers)
            shard.apply(total, headers[0])
        reply[0] = shard.version
        _wait([work for w in range(workers)
               for work in (pg.send([reply], w, REPLY), pg.send([shard.param], w, PARAMS))])


def serve_async(pg: Group, shard: Shard, workers: int, squeeze: compression.Compressor) -> None:
    lock = threading.Lock()
    errors: list[BaseException] = []

    def serve_one(worker: int) -> None:
        header = torch.empty(HEADER_SIZE, dtype=torch.float64)
        wire, grad = _wire(shard, squeeze), torch.empty_like(shard.param)
        reply = torch.empty(1, dtype=torch.float64)
        try:
            while True:
                pg.recv([header], worker, HEADER).wait()
                kind = int(header[0])
                if kind == STOP:
                    return
                if kind in CHECKPOINT_KINDS:  # worker 0 alone sends these in async mode
                    with lock:
                        shard.checkpoint(pg, kind, header)
                    continue
                if kind == PUSH:
                    pg.recv([wire], worker, GRAD).wait()
                    squeeze.decompress(wire, grad).div_(workers)  # its weight in the synchronous average
                with lock:
                    if kind == PUSH:
                        shard.apply(grad, header)
                    reply[0] = shard.version
                    fresh = shard.param.clone()  # others may update while this one is sent
                _wait([pg.send([reply], worker, REPLY), pg.send([fresh], worker, PARAMS)])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=serve_one, args=(w,), daemon=True,
                                name=f"worker{w}") for w in range(workers)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads) and not errors:
        time.sleep(0.01)
    if errors:  # the other threads may be blocked in a receive: leave them to the exit
        raise errors[0]


def main() -> None:
    spec = Spec.from_env()
    _die_with_parent(spec.parent_pid)
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=timeout)
    store.set(f"{PREFIX}ready/{spec.index}", str(os.getpid()))
    pg = open_group(store, spec.workers + spec.index, spec.workers + spec.servers, timeout)
    shard = Shard(torch.empty(spec.stop - spec.start, dtype=getattr(torch, spec.dtype)))
    pg.recv([shard.param], 0, INIT).wait()
    serve = serve_sync if spec.mode == "sync" else serve_async
    serve(pg, shard, spec.workers, compression.make(spec.compression))
    pg.barrier().wait()  # every worker has its last reply before anyone closes a socket


if __name__ == "__main__":
    # os._exit, not a normal exit: no gloo teardown here (sockets close with the process, which
    # idle peers take calmly), and in async mode threads may still be blocked in a receive
    try:
        main()
    except Exception:  # noqa: BLE001 - rank 0 shows the tail of this log when a server fails
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)
