"""Running ``parascale comm``: its workers launched here (or this rank joined under
torchrun/srun), the record produced in one piece, and the results printed as nccl-tests does."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from parascale import safejson
from parascale.comm.config import RECORD_NAME, CommConfig, format_size, validate
from parascale.runtime import contract


def run(cfg: CommConfig) -> dict[str, Any]:
    """Measure and return the record (written to ``cfg.out`` when given). Rank 0 only under
    torchrun/srun; other ranks get an empty dict. ``cfg.out`` keeps its previous comm.json
    until this measurement has finished (see :mod:`parascale.runtime.staging`)."""
    from parascale.runtime.env import available_cores, cores_per_worker, external_launcher
    from parascale.errors import WorkerFailure
    from parascale.files import check_writable_folder
    from parascale.runtime import (check_oversubscription, external_size, launch, open_store,
                                   resolve_device_type)
    from parascale.runtime.staging import produce

    if external_launcher():
        size = external_size()
    else:
        size = len(cfg.gpus) if cfg.gpus else (cfg.workers or available_cores())
    validate(cfg, size)
    resolve_device_type("cuda" if cfg.gpus else "auto", cfg.gpus)
    if cfg.out:
        check_writable_folder(cfg.out)
    if external_launcher():
        from parascale.comm.worker import run_worker

        return run_worker(cfg) or {}
    threads = cores_per_worker(size)
    check_oversubscription(size, threads, available_cores(), insist=cfg.oversubscribe)
    store = open_store(cfg.port)  # a busy --port is refused before anything is written

    def measure(folder) -> dict[str, Any]:
        resolved = dataclasses.replace(cfg, workers=size, out=str(folder))
        outcome = launch("parascale.comm.worker", size,
                         {contract.COMM_CONFIG: safejson.dumps(resolved.to_dict())},
                         threads=threads, store=store)
        if outcome.status != "ok":
            raise WorkerFailure(outcome.message, outcome.rank)
        record = json.loads((folder / RECORD_NAME).read_text())
        record["config"]["out"] = cfg.out
        return record

    return produce(cfg.out, "parascale-comm-", measure, RECORD_NAME,
                   lambda record: safejson.dumps(record, indent=2) + "\n")


def format_table(record: dict[str, Any]) -> str:
    """The results as nccl-tests prints them: one line per operation and size."""
    n = record["world_size"]
    lines = [f"{'op':<11}{'size':>8}{'iters':>7}{'time':>12}{'algbw GB/s':>12}"
             f"{'busbw GB/s':>12}   ({n} workers, {record['environment']['backend']}, "
             f"time = slowest rank's median)"]
    for r in record["results"]:
        t = r["time_s"]
        shown = f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"
        lines.append(f"{r['op']:<11}{format_size(r['bytes']):>8}{r['iterations']:>7}{shown:>12}"
                     f"{r['algbw_bytes_per_s'] / 1e9:>12.3f}{r['busbw_bytes_per_s'] / 1e9:>12.3f}")
    return "\n".join(lines)
