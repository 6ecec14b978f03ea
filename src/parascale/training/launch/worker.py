"""Entry point of one locally launched worker: ``python -m parascale.training.launch.worker``.

The launcher passes the resolved configuration and its step plan as JSON (the variables
``CONFIG`` and ``PLAN`` of :mod:`parascale.runtime.contract`). A failure is written to the error
file for the launcher (which names this rank) before the process exits.
"""
from __future__ import annotations

import json
import os

from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.runtime import contract
from parascale.runtime.failure import serve_as_worker
from parascale.training.loop.train import run_worker

if __name__ == "__main__":
    cfg = TrainConfig.from_dict(json.loads(os.environ[contract.CONFIG]))
    plan = Plan.from_dict(json.loads(os.environ[contract.PLAN]))
    serve_as_worker(lambda: run_worker(cfg, teardown=False, plan=plan))
