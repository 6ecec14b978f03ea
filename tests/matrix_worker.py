"""One process of the matrix's shared world (tests/matrix_world.py): it runs case after case.

Started once per test module (forked from parascale's fork server, as a launch's workers are),
it takes each case's command from the driver's control store, becomes that case's rank (the
variables a local launch gives a worker), runs the entry's real worker code, ``train``'s
(``training.loop.train.run_worker``, as ``parascale.training.launch.worker`` runs it) or ``run``'s
(``script.running.run_script``, as ``parascale.script.worker`` runs it), and answers. Only the
process start is shared: every case joins a world of its own (a fresh store and process group),
builds its strategy, model and data, and leaves the world again. Whatever a case started (a
parameter server's processes) must have ended with it: one left running fails the case.
"""
from __future__ import annotations

import datetime
import json
import os
import traceback

import psutil
import torch.distributed as dist

from parascale import safejson
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.runtime import leave
from parascale.runtime.failure import describe, is_secondary

#: the driver's control store (its port), and this process's place in the shared world and
#: its start there, "I.G" (G is 1, then 2 after the first failure on process I...)
CONTROL = "MATRIX_CONTROL_PORT"
INDEX = "MATRIX_INDEX"
WAIT = datetime.timedelta(hours=1)  # for the next command: the driver's session decides


def run_case(command: dict) -> None:
    """One case's part on this process, through the entry's own worker code."""
    if command["entry"] == "train":
        from parascale.training.loop.train import run_worker

        run_worker(TrainConfig.from_dict(command["config"]),
                   plan=Plan.from_dict(command["plan"]))
        return
    import parascale.script
    from parascale.script.running import run_script

    try:
        run_script(command["script"], command["argv"])
        dist.barrier()  # as runtime.world.joined does: every rank meets before any leaves
    finally:
        parascale.script._current = None  # the next case's script starts its own run
        leave()


def leftovers() -> list[str]:
    """The processes this one started that still run (then stopped), as 'pid command'."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            found.append(f"{child.pid} {' '.join(child.cmdline())[:120]}")
            child.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(psutil.Process().children(recursive=True), timeout=5)
    return found


def warm() -> None:
    """What every case would import on first use, imported while the driver still prepares:
    the jobs' own modules (scikit-learn's digits), the entries' worker code."""
    import matrix_jobs  # noqa: F401
    import parascale.script.running  # noqa: F401
    import parascale.training.loop.train  # noqa: F401
    from sklearn.datasets import load_digits  # noqa: F401


def main() -> None:
    index = os.environ[INDEX]
    if index.endswith(".1"):  # the first start; one after a failure imports as cases need
        warm()
    store = dist.TCPStore("127.0.0.1", int(os.environ[CONTROL]), is_master=False, timeout=WAIT)
    base = dict(os.environ)
    for number in range(10**9):
        key = f"command/{index}/{number}"
        store.wait([key])
        command = json.loads(store.get(key))
        if command["entry"] == "exit":
            return
        os.environ.clear()
        os.environ.update({**base, **command["env"]})
        answer: dict = {"error": None}
        try:
            run_case(command)
        except BaseException as exc:  # noqa: BLE001 - the driver names the case and the error
            # a broken collective is the echo of another rank's failure: that one is the cause
            answer = {"error": describe(exc), "detail": traceback.format_exc(),
                      "secondary": is_secondary(exc)}
            leave()
        left = leftovers()
        if left and answer["error"] is None:
            answer["error"] = f"processes the case started still run after it: {'; '.join(left)}"
        store.set(f"reply/{index}/{number}", safejson.dumps(answer))


if __name__ == "__main__":
    main()
