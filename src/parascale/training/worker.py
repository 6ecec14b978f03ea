"""Entry point of one locally launched worker: ``python -m parascale.training.worker``.

The launcher passes the resolved configuration as JSON in ``PARASCALE_CONFIG``. A failure is
written to the error file for the launcher (which names this rank) before the process exits.
"""
from __future__ import annotations

import json
import os

from parascale.config import TrainConfig
from parascale.runtime.failure import serve_as_worker
from parascale.training.loop import run_worker

if __name__ == "__main__":
    cfg = TrainConfig.from_dict(json.loads(os.environ["PARASCALE_CONFIG"]))
    serve_as_worker(lambda: run_worker(cfg, teardown=False))
