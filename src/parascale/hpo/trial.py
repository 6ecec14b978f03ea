"""One trial's process: pinned to its cores, it trains one configuration and leaves its record.

Started by the search (forked from its fork server, so torch is already imported) with the
trial in ``PARASCALE_TRIAL``. The affinity is set before anything else, so the workers this
process starts, and their thread counts, follow it; then the trial forks its own fork server
for its workers from itself (``processes.fork_own_server``), in milliseconds, where a fresh
one would import torch again. A configuration the trainer refuses (a batch
larger than the data set, say) leaves ``error.json`` with the one line, and exit code 2.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from parascale import safejson
from parascale.runtime import contract

SPEC_ENV = contract.TRIAL
ERROR_NAME = "error.json"


def main() -> int:
    spec = json.loads(os.environ[SPEC_ENV])
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec["cores"])
    from parascale.runtime.processes import fork_own_server

    fork_own_server()  # before this process starts a thread or trains
    from parascale.errors import UsageError
    from parascale.files import atomic_write_text
    from parascale.interrupts import EXIT_CODE, Terminated, sigterm_interrupts
    from parascale.training import train

    error = Path(spec["config"]["out"]) / ERROR_NAME
    try:
        with sigterm_interrupts():
            train(spec["config"])
        return 0
    except UsageError as exc:
        atomic_write_text(error, safejson.dumps({"reason": str(exc)}))
        return 2
    except Terminated:
        return EXIT_CODE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the search records it and goes on
        atomic_write_text(error, safejson.dumps({"reason": f"{type(exc).__name__}: {exc}",
                                             "detail": traceback.format_exc()}))
        return 1


if __name__ == "__main__":
    from parascale.runtime.processes import exit_now

    code = main()
    sys.stdout.flush()
    exit_now(code)
