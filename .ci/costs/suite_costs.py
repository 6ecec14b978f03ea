"""A pytest plugin that measures what each test costs (.ci/costs/README.md): its wall time, the
CPU time of its process and of everything it starts, and the seconds it sleeps.

CPU: each pytest process (each xdist worker) moves itself into a cpuacct cgroup of its own
(cgroup v1, as root), so a test's CPU is the group's usage across the test: its children,
grandchildren and fork servers' children included, whoever reaps them. Where no such group can
be made, the figure is this process's own CPU and that of the children it reaped (what a fork
server's children used is missing): ``cpu_complete`` is false then. Sleeps: ``time.sleep``
calls in the test process, summed by the test line that made them.

Writes ``SUITE_COSTS/tests.jsonl``, a line per test; ``summary.py`` reads it."""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

FOLDER = Path(os.environ.get("SUITE_COSTS", "suite-costs"))
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _own_group() -> Path | None:
    group = CPUACCT / f"suite-costs-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return None
    return group


class Costs:
    def __init__(self) -> None:
        FOLDER.mkdir(parents=True, exist_ok=True)
        self.group = _own_group()
        self.sleeps: Counter[str] = Counter()
        self.watching = False
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple) -> None:
        if event != "time.sleep" or not self.watching:
            return
        frame = sys._getframe(1)
        while frame is not None and "/tests/" not in frame.f_code.co_filename:
            frame = frame.f_back
        where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}" if frame else "?"
        self.sleeps[where] += float(args[0])

    def cpu(self) -> float:
        if self.group is not None:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.sleeps.clear()
        start, cpu, own = time.time(), self.cpu(), os.times()
        self.watching = True
        yield
        self.watching = False
        end, used, own_after = time.time(), self.cpu() - cpu, os.times()
        line = {"id": item.nodeid, "start": start, "end": end, "wall": end - start,
                "cpu": used, "cpu_complete": self.group is not None,
                "own_cpu": own_after.user + own_after.system - own.user - own.system,
                "cgroup": f"/{self.group.name}" if self.group else "",
                "slow": item.get_closest_marker("slow") is not None,
                "slept": sum(self.sleeps.values()), "sleeps": dict(self.sleeps.most_common(3))}
        with open(FOLDER / "tests.jsonl", "a") as out:
            out.write(json.dumps(line) + "\n")

    def pytest_unconfigure(self, config) -> None:
        if self.group is None:
            return
        try:  # back to the parent group, and the empty one removed
            (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        except OSError:
            pass


def pytest_configure(config) -> None:
    config.pluginmanager.register(Costs(), "suite-costs")
