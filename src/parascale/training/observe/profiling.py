"""``--profile A:B``: torch.profiler over optimizer steps A to B on every rank, one trace each.

Each rank writes DIR/traces/rank-<R>.json with the profiler's own Chrome-trace export (Perfetto
and chrome://tracing open it). Every profiled step is a range ``parascale.step N`` holding
``parascale.data``, ``parascale.compute``, ``parascale.sync`` and ``parascale.optimizer``.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from parascale import safejson
from parascale.config import TrainConfig, profile_steps
from parascale.record import TRACES_NAME
from parascale.runtime.world import World

TRACES = TRACES_NAME  # the folder beside the record
# the trace's own note of the steps it holds: a resumed run reads it rather than guessing
_KEY = "parascale_steps"


def trace_steps(path: Path) -> list[int] | None:
    """The steps [first, last] in a trace parascale wrote, or None (absent or unreadable)."""
    try:
        steps = json.loads(path.read_text())[_KEY]
        return [int(steps[0]), int(steps[1])]
    except (OSError, ValueError, LookupError, TypeError):
        return None


@dataclass
class _Trace:
    """The trace under way: torch's profiler, the steps it holds so far, the window's last
    step and the open ``parascale.step N`` range."""

    prof: profile
    began: int
    last: int
    end: int
    step_range: Any = None


class Profiler:
    """What the loop calls every step; does nothing outside the profiled steps."""

    def __init__(self, cfg: TrainConfig, world: World, shown: Path | None = None):
        """``shown``: the folder the user gave as --out, where a local worker's own --out is a
        staging folder (its traces are said to be where they will be kept)."""
        self.window = profile_steps(cfg.measure.profile)
        self.world = world
        self.folder = Path(cfg.output.out or ".") / TRACES
        self.shown = shown / TRACES if shown is not None else self.folder
        self.path = self.folder / f"rank-{world.rank}.json"
        self._trace: _Trace | None = None
        self._first: int | None = None  # this process's first and latest steps
        self._last: int | None = None
        self._wrote: list[int] | None = None  # the steps in the trace this process wrote
        self._keep = False  # a resumed run leaves an earlier attempt's fuller trace alone
        self._error: str | None = None
        self._summary: dict[str, Any] | None = None

    def covers(self, first: int, last: int) -> bool:
        """Whether steps ``first`` to ``last`` (an epoch's) meet the window: they ran slower."""
        return self.window is not None and first <= self.window[1] and last >= self.window[0]

    def step_begins(self, step: int) -> None:
        """Before step ``step`` (1-based) takes its first batch (through ``StepPhases.begin``)."""
        if self.window is None:
            return
        first, last = self.window
        if self._first is None:
            self._first = step
            if step == 1:  # a fresh run: an earlier run's traces in this folder are not its own
                self._clear_stale()
            elif first < step <= last and (held := trace_steps(self.path)) is not None:
                self._keep = held[1] - held[0] >= last - step
        self._last = step
        trace = self._trace
        if trace is None and first <= step <= last and self._wrote is None and not self._keep:
            activities = [ProfilerActivity.CPU]
            if self.world.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            else:  # kineto's lines on a CPU (a failed GPU count, as ERROR) are noise in the log
                os.environ.setdefault("KINETO_LOG_LEVEL", "6")
            # no shapes, stacks or memory: the ranges and their times are what is asked for,
            # and each of those multiplies a trace's size
            prof = profile(activities=activities, record_shapes=False, with_stack=False,
                           profile_memory=False)
            prof.start()
            trace = self._trace = _Trace(prof, began=step, last=step, end=last)
        if trace is not None:  # our own range, not prof.step(): it has the run's number
            trace.last = step
            trace.step_range = record_function(f"parascale.step {step}")
            trace.step_range.__enter__()

    @property
    def tracing(self) -> bool:
        """Whether the step under way is traced: its phases are ranges of the trace
        (training/observe/phases.py opens them)."""
        return self._trace is not None

    def step_ends(self, step: int) -> None:
        """After step ``step``; the trace is written after the window's last step."""
        trace = self._trace
        if trace is None:
            return
        trace.step_range.__exit__(None, None, None)
        if step >= trace.end:
            self._write(trace)

    def _clear_stale(self) -> None:
        self.path.unlink(missing_ok=True)
        if self.world.is_main:  # an earlier run with more workers left rank files beyond ours
            for p in self.folder.glob("rank-*.json"):
                if p.stem[5:].isdigit() and int(p.stem[5:]) >= self.world.size:
                    p.unlink(missing_ok=True)

    def _write(self, trace: _Trace) -> None:
        """Stop and export, atomically: a reader never meets half a trace."""
        self._trace = None
        prof = trace.prof
        self._wrote = [trace.began, trace.last]
        prof.add_metadata_json(_KEY, safejson.dumps(self._wrote))
        prof.stop()
        tmp = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.stem}.", suffix=".part",
                                       dir=self.folder)
            os.close(fd)
            prof.export_chrome_trace(tmp)
            os.replace(tmp, self.path)
        except (OSError, RuntimeError) as e:  # a trace is not worth the run: the record says it
            self._wrote, self._error = None, f"rank {self.world.rank}'s trace: {e}"
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)

    def close(self) -> None:
        """Once after training (also when it stopped early); collective under --profile."""
        window = self.window
        if window is None:
            return
        if self._trace is not None:  # training ended inside the window
            self._write(self._trace)
        held = self._wrote or trace_steps(self.path)  # else what an earlier attempt wrote
        mine = {"rank": self.world.rank, "steps": held, "error": self._error,
                "earlier": self._wrote is None and held is not None}
        facts: list[Any] = [mine]
        if dist.is_initialized() and self.world.size > 1:
            facts = [None] * self.world.size
            dist.all_gather_object(facts, mine)
        if not self.world.is_main:
            return
        s = self._summary = self._summarise(facts, window)
        if s["traces"]:
            line = (f"traces of steps {s['profiled'][0]}-{s['profiled'][1]} written to "
                    f"{self.shown} ({len(s['traces'])} ranks)")
        else:
            line = f"no traces of steps {s['steps'][0]}-{s['steps'][1]}"
        print(f"parascale: {line}" + (f" ({s['note']})" if s["note"] else ""), flush=True)

    def _summarise(self, facts: list[dict[str, Any]], window: tuple[int, int]) -> dict[str, Any]:
        first, last = window
        traced = [f for f in facts if f["steps"] is not None]
        steps = traced[0]["steps"] if traced else None
        missing = [str(f["rank"]) for f in facts if f["steps"] is None]
        notes = []
        resumed = None if self._first is None else self._first - 1
        if resumed is not None and resumed >= first:
            notes.append(f"the run resumed after step {resumed}")
        if self._last is not None and self._last < last:
            notes.append(f"training ended at step {self._last}, before step {last}")
        if any(f["earlier"] for f in traced):
            notes.append("the traces are an earlier attempt's")
        if not traced:
            notes.append("no trace was written")
        elif missing:
            notes.append(f"no trace from rank(s) {', '.join(missing)}")
        notes += [f"could not write {f['error']}" for f in facts if f["error"]]
        return {"steps": [first, last], "profiled": steps,
                "profiled_steps": steps[1] - steps[0] + 1 if steps else 0,
                "traces": [f"{TRACES}/rank-{f['rank']}.json" for f in traced],
                "complete": steps == [first, last] and not missing,
                "note": "; ".join(notes) or None}

    def summary(self) -> dict[str, Any] | None:
        """The record's ``profile`` section on rank 0, or None without --profile."""
        return self._summary
