"""Entry point of one locally launched worker: ``python -m parascale.training.worker``.

The launcher passes the resolved configuration as JSON in ``PARASCALE_CONFIG``. A failure is
written to the error file for the launcher (which names this rank) before the process exits.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

from parascale.config import TrainConfig
from parascale.runtime.failure import is_secondary, write_error_file
from parascale.training.loop import run_worker


def main() -> int:
    cfg = TrainConfig.from_dict(json.loads(os.environ["PARASCALE_CONFIG"]))
    try:
        run_worker(cfg, teardown=False)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        write_error_file(exc)
        if not is_secondary(exc) and not isinstance(exc, KeyboardInterrupt):
            traceback.print_exc()  # rank 0's goes to the terminal, others' to their log
        return 1
    return 0


def exit_now(code: int) -> None:
    """Leave without running C++ destructors (see ``run_worker``); output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
