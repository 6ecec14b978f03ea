"""Waiting for a quiet machine before a run (``parascale bench --quiet-machine``).

A run measured while another program holds a core is slower for a reason that has nothing to do
with scaling. Before each run the study samples what other programs use (``runtime.machine``:
the kernel's CPU counters minus this process) over a short window, and starts the run once that
load is below the busy threshold, or once the stated maximum wait has passed: a study must end,
and a run on a busy machine is still recorded, flagged by its machine block and by the study
block's ``quiet_machine`` entry, which says how long the study waited and what it saw last.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from parascale.runtime import machine

WINDOW_S = 1.0  # one sample: long enough for the counters to be meaningful, short per run
DEFAULT_MAX_S = 120.0


def _sample(window_s: float) -> tuple[dict[str, float], dict[str, Any]]:
    """Other programs' load over the next ``window_s`` seconds, and who used it: the largest
    processes seen at both ends, and what all those used (``machine.others_text``)."""
    mine = {os.getpid()}
    before = machine.process_times(exclude=mine)
    seen = machine.sample_other_cores(window_s)
    after = machine.process_times(exclude=mine)
    used = machine.top_others(before, after, seen["seconds"], n=len(after))
    return seen, {"other_cores": seen["other_cores"],
                  "seen_cores": round(sum(p["cores"] for p in used), 3),
                  "top_others": used[:machine.TOP_OTHERS]}


def _who(who: dict[str, Any]) -> str:
    return f"; {machine.others_text(who)}"


def wait_for_quiet(max_s: float, echo: Callable[[str], None] = lambda line: None,
                   window_s: float = WINDOW_S) -> dict[str, Any]:
    """Sample until other programs use less than the busy threshold or ``max_s`` has passed;
    what was seen, for the study block. At least one sample is always taken."""
    cores = machine.cores()
    threshold = machine.busy_threshold(cores)
    began = time.monotonic()
    announced = False
    while True:
        seen, who = _sample(window_s)
        other, steal = seen["other_cores"], seen["steal_cores"]
        quiet = not machine.is_busy(other, steal, cores)
        waited = time.monotonic() - began
        if quiet:
            break
        if not announced:
            echo(f"waiting for a quiet machine (other programs below {threshold:.2f} of {cores} "
                 f"cores, at most {max_s:.0f} s): now {other + steal:.2f} cores{_who(who)}")
            announced = True
        if waited + window_s > max_s:  # another sample would pass the maximum
            break
    if not quiet:
        echo(f"the machine is still busy after {waited:.0f} s ({other + steal:.2f} other cores"
             f"{_who(who)}): running anyway; the record says so")
    elif announced:
        echo(f"quiet after {waited:.0f} s ({other + steal:.2f} other cores)")
    return {"quiet": quiet, "waited_s": round(waited, 2), "max_s": max_s,
            "other_cores": round(other, 3), "steal_cores": round(steal, 3),
            "busy_threshold_cores": threshold, "cores": cores, "seen_cores": who["seen_cores"],
            "top_others": who["top_others"]}
