"""The matrix's process tier shares its processes, not its worlds (docs/design.md, "The
combination matrix (issue 32)").

:class:`SharedWorld` starts its processes once (tests/matrix_worker.py, forked from parascale's
fork server as a launch's workers are) and runs case after case on them: for each, it plays the
launcher's part (a fresh rendezvous store on loopback, the variables a local launch gives each
rank, the resolved configuration and the step plan it checked), and the processes run the entry's
own worker code. Two processes make a 2-worker world; either alone makes a world of one, so
two references (1 worker x the whole batch) run at once. A case that fails, hangs or leaves a
process behind is reported with its error, and the processes it ran on are started again, so
that the next case starts clean.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parascale import data, safejson
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.record import read_record
from parascale.runtime import contract, open_store, processes
from parascale.script.launch import spec as script_spec

import matrix_worker

#: how long one case may take before its processes are stopped and it fails as hung: far more
#: than any case needs, well under the suite's per-test limit
CASE_LIMIT_S = 120.0
#: after one rank of a case failed, how long the others have to answer before they are stopped
PEERS_S = 1.0
#: how often, while a case runs, the driver looks whether its processes are still alive
WATCH_S = 0.2


@dataclass
class Result:
    """What a case left: its record and final parameters, or the first failure, named."""

    error: str | None
    record: dict[str, Any] | None = None
    state: dict[str, torch.Tensor] | None = None


@dataclass
class Run:
    """One world's run: ``train``'s workers (``plan`` given) or ``run``'s copies of a script."""

    cfg: TrainConfig  # validated and checked, as the launcher has it
    out: Path
    processes: tuple[int, ...]  # which of the shared processes are its ranks 0, 1, ...
    plan: Plan | None = None
    script: str | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # more variables (a fault to inject)


class SharedWorld:
    """``size`` processes that run world after world; ``run`` hands them out."""

    def __init__(self, size: int, folder: Path):
        self.folder = folder
        self.control = open_store(None, timeout_s=CASE_LIMIT_S)
        self.generation = [0] * size
        self.sent = [0] * size
        self.children = [self._start(index) for index in range(size)]

    def _start(self, index: int) -> processes.Child:
        self.generation[index] += 1
        self.sent[index] = 0
        env = {**os.environ, matrix_worker.CONTROL: str(self.control.port),
               matrix_worker.INDEX: f"{index}.{self.generation[index]}",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        return processes.start_module("matrix_worker", env, self.log(index), 1,
                                      f"matrix-{index}")

    def log(self, index: int) -> Path:
        return self.folder / f"process{index}.{self.generation[index]}.log"

    def close(self) -> None:
        for index in range(len(self.children)):
            self._send(index, {"entry": "exit"})
        processes.stop(self.children, 5.0)

    def _send(self, index: int, command: dict) -> str:
        key = f"{index}.{self.generation[index]}/{self.sent[index]}"
        self.sent[index] += 1
        self.control.set(f"command/{key}", safejson.dumps(command))
        return f"reply/{key}"

    def run(self, runs: list[Run]) -> list[Result]:
        """Run ``runs`` at once (on distinct processes); each one's result."""
        busy = [i for run in runs for i in run.processes]
        assert len(busy) == len(set(busy)), "two runs on one process"
        stores = [open_store(None) for _ in runs]  # each world's, held until it is collected
        waiting = [self._launch(run, store.port) for run, store in zip(runs, stores)]
        return [self._collect(run, keys) for run, keys in zip(runs, waiting)]

    def _launch(self, run: Run, port: int) -> dict[int, str]:
        """Play the launcher: each rank told what a local launch tells it."""
        size = len(run.processes)
        resolved = run.cfg.replace(workers=size, out=str(run.out))
        run.out.mkdir(parents=True, exist_ok=True)
        env = {contract.STORE_PORT: str(port), contract.WORLD_SIZE: str(size),
               contract.CHECKPOINTS: "", contract.RESUME: "", contract.LOG: "",
               contract.ATTEMPT: "0", **run.env}
        if run.script is None:
            command = {"entry": "train", "config": resolved.to_dict(),
                       "plan": run.plan.to_dict() if run.plan else None}
            if resolved.job.task is None:  # the data the launcher built, handed over
                env.update(data.handover_env(resolved))
        else:
            command = {"entry": "run", "script": run.script, "argv": run.argv}
            env[contract.SCRIPT] = script_spec(resolved, Path(run.script), run.argv)
        return {index: self._send(index, {**command, "env": {
            **env, contract.RANK: str(rank), contract.LOCAL_RANK: str(rank)}})
            for rank, index in enumerate(run.processes)}

    def _answers(self, keys: dict[int, str]) -> dict[int, dict]:
        """Each process's answer; one that died, hung, or still runs a while after another
        failed (it waits on a collective that will not come) is stopped, and says so."""
        answers: dict[int, dict] = {}
        deadline = time.monotonic() + CASE_LIMIT_S
        failed_at = None
        while len(answers) < len(keys):
            waiting = [key for index, key in keys.items() if index not in answers]
            try:  # returns as soon as every answer is in: no polling while the case runs
                self.control.wait(waiting, datetime.timedelta(seconds=WATCH_S))
            except dist.DistStoreError:
                pass  # not all yet: see who is still alive
            for index, key in keys.items():
                if index in answers:
                    continue
                if self.control.check([key]):
                    answers[index] = json.loads(self.control.get(key))
                elif (code := self.children[index].poll()) is not None:
                    tail = processes.tail(self.log(index), "")[-600:]
                    answers[index] = {"error": f"the process {processes.exit_text(code)}; its "
                                               f"last output: {tail}"}
                if answers.get(index, {}).get("error") and failed_at is None:
                    failed_at = time.monotonic()
            now = time.monotonic()
            if failed_at is not None and now - failed_at > PEERS_S:
                why = f"still running {PEERS_S:g} s after another rank failed"
            elif now > deadline:
                why = f"no answer within {CASE_LIMIT_S:g} s"
            else:
                continue
            for index in keys:
                answers.setdefault(index, {"error": f"{why}: stopped", "secondary": True})
        return answers

    def _collect(self, run: Run, keys: dict[int, str]) -> Result:
        answers = self._answers(keys)
        errors = [(rank, answers[index]) for rank, index in enumerate(run.processes)
                  if answers[index]["error"]]
        if errors:  # the next world starts on processes of its own
            processes.stop([self.children[i] for i in run.processes], 0.0)
            for index in run.processes:
                self.children[index] = self._start(index)
            rank, first = min(errors, key=lambda e: bool(e[1].get("secondary")))
            print(first.get("detail") or "", file=sys.stderr)
            return Result(f"rank {rank}: {first['error']}")
        record = read_record(run.out / "record.json")  # within the record contract
        model = run.out / "model.pt"
        state = torch.load(model, map_location="cpu") if model.exists() else None
        return Result(None, record, state)
