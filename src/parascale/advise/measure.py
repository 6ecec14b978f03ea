"""What advise measures here, briefly, as one ``bench`` study in OUT/measure (resumable: a
second advise of the same job keeps the runs, ``--remeasure`` runs them again):

- the **pilot**: the job itself on 2 workers under the default strategy at its own global
  batch (each worker half of it) and learning rate, until it reaches the target (or for
  ``--pilot-epochs`` for a budget). It measures the gradient noise scale and its standard
  error (which needs two ranks: each rank's gradient and the mean), the steps to the target at
  the reference batch, an evaluation's time, the memory split, and a 2-worker exchange;
- **probes**: one worker, a few per-device batches, ``--probe-steps`` steps each: compute(b)
  and the optimizer's time, the per-step spread (predict's calibration);
- **baselines**: N = 2 … workers processes exchanging nothing (``bench --baseline``'s runs):
  how N processes on this machine slow each other's compute;
- **the link**: ``parascale comm``'s allreduce timed on the workers, at sizes around the
  gradient's, for α and β.

Every run records the machine's load (runtime/machine.py); a run on a busy machine is marked
so in the inputs. Each part's wall time is said.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parascale import sync
from parascale.report.load import RunRecord

#: most probe batches measured (the line through them is predict's compute(b))
PROBES = 4
COMM_NAME = "comm"


@dataclass
class Plan:
    """The runs to make, as cases of one study (each a dict of train options)."""

    pilot: dict[str, Any] | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    comm_workers: int = 0

    def cases(self) -> list[dict[str, Any]]:
        return [c for c in [self.pilot, *self.probes, *self.baselines] if c is not None]


@dataclass
class Readings:
    """The records the plan made, by role, and what measuring took."""

    pilot: RunRecord | None = None
    probes: list[RunRecord] = field(default_factory=list)
    baselines: list[RunRecord] = field(default_factory=list)
    comm: dict[str, Any] | None = None
    lines: list[str] = field(default_factory=list)


def probe_batches(reference: int, space: list[int]) -> list[int]:
    """Up to :data:`PROBES` per-device batches that span the space and hold its reference."""
    if not space:
        return [reference]
    chosen = {space[0], space[-1], min(space, key=lambda b: abs(b - reference))}
    rest = [b for b in space if b not in chosen]
    while len(chosen) < PROBES and rest:
        chosen.add(rest.pop(len(rest) // 2))
    return sorted(chosen)


#: a run's length, unset before a case sets its own (a job's --epochs beside a case's --steps
#: would be refused)
UNSET_LENGTH = {"epochs": None, "steps": None}


def plan(job: dict[str, Any], *, workers: int, threads: int, pilot_batch: int | None,
         target: bool, pilot_epochs: int, batches: list[int], probe_steps: int,
         baselines: bool, probe_batch: int) -> Plan:
    """The runs to make. ``pilot_batch``: the pilot's global batch (None: no pilot);
    ``batches``: the probes' per-device batches (empty: none); ``baselines``: one per N from
    2 to ``workers`` at ``probe_batch``."""
    found = Plan(comm_workers=workers if baselines and workers >= 2 else 0)
    quiet = {"noise_scale": False, "stop_at_target": False, "target_metric": None,
             "target_value": None, "target_accuracy": None}
    if pilot_batch is not None:
        pilot = {"workers": 2, "global_batch": pilot_batch, "batch_size": None,
                 "sync": sync.DEFAULT, "noise_scale": True, "threads": threads}
        if target:
            pilot.update(stop_at_target=True)
        else:
            pilot.update(UNSET_LENGTH, epochs=pilot_epochs)
        found.pilot = pilot
    for b in batches:
        found.probes.append({**quiet, **UNSET_LENGTH, "workers": 1, "batch_size": b,
                             "global_batch": None, "steps": probe_steps, "threads": threads,
                             "sync": sync.DEFAULT})
    if baselines:
        for n in range(2, workers + 1):
            found.baselines.append({**quiet, **UNSET_LENGTH, "workers": n,
                                    "batch_size": probe_batch, "global_batch": None,
                                    "steps": probe_steps, "threads": threads,
                                    "sync": sync.BASELINE})
    return found


def run(job: dict[str, Any], measure_plan: Plan, folder: Path, gradient_bytes: Callable[
        [Readings], float], echo: Callable[[str], None], rerun: str = "never",
        quiet_max_s: float | None = None) -> Readings:
    """Make the plan's runs (a study in ``folder``) and the link's measurement; their
    records by role."""
    from parascale.bench.runner import run_study
    from parascale.bench.study import StudyInputs, make_jobs

    readings = Readings()
    cases = measure_plan.cases()
    if cases:
        began = time.monotonic()
        inputs = StudyInputs(parameters={k: v for k, v in job.items()},
                             extensions=[{"cases": cases}])
        jobs = make_jobs(inputs)
        echo(f"measuring: {len(jobs)} short run(s) in {folder}")
        records = run_study(folder, jobs, rerun, echo, inputs=dataclasses.asdict(inputs),
                            quiet_max_s=quiet_max_s)
        by_case = _match(jobs, cases, job, records, folder)
        readings.pilot = by_case.get(id(measure_plan.pilot)) if measure_plan.pilot else None
        readings.probes = [by_case[id(c)] for c in measure_plan.probes if id(c) in by_case]
        readings.baselines = [by_case[id(c)] for c in measure_plan.baselines
                              if id(c) in by_case]
        readings.lines.append(_said("the runs", len(jobs), time.monotonic() - began,
                                    list(by_case.values())))
    if measure_plan.comm_workers >= 2:
        began = time.monotonic()
        readings.comm = _link(measure_plan.comm_workers, gradient_bytes(readings),
                              folder / COMM_NAME, rerun, echo)
        readings.lines.append(f"the link: parascale comm on {measure_plan.comm_workers} "
                              f"workers, {time.monotonic() - began:.1f} s")
    return readings


def job_of(jobs: list, cases: list[dict[str, Any]], case: dict[str, Any],
           base: dict[str, Any]) -> Any:
    """The study's job of ``case`` (the planner orders jobs by memory, not as the cases came):
    the one whose value of every key any case sets is the case's, or the base's where the
    case leaves it out."""
    keys = {k for c in cases for k in c}
    wanted = {k: case[k] if k in case else base.get(k) for k in keys}
    return next(j for j in jobs if {k: j.params.get(k) for k in keys} == wanted)


def _match(jobs: list, cases: list[dict[str, Any]], base: dict[str, Any],
           records: dict[str, dict[str, Any]], folder: Path) -> dict[int, RunRecord]:
    """Each case's record."""
    from parascale.errors import WorkerFailure

    found: dict[int, RunRecord] = {}
    for case in cases:
        job = job_of(jobs, cases, case, base)
        record = records[job.folder]
        if record.get("status") != "ok":
            raise WorkerFailure(f"a measuring run failed ({job.label}): "
                                f"{record.get('reason')} (its record: "
                                f"{folder / 'runs' / job.folder / 'record.json'})")
        found[id(case)] = RunRecord(folder / "runs" / job.folder / "record.json",
                                    str(folder), record)
    return found


def _said(what: str, count: int, seconds: float, records: list[RunRecord]) -> str:
    busy = [r for r in records if r.get("machine", "busy") is True]
    quiet = f"; {len(busy)} on a busy machine" if busy else "; the machine was quiet"
    return f"{what}: {count} run(s), {seconds:.1f} s{quiet}"


def _link(workers: int, size: float, folder: Path, rerun: str,
          echo: Callable[[str], None]) -> dict[str, Any]:
    """A comm record at sizes around ``size`` bytes (kept from an earlier advise unless
    ``rerun`` is always)."""
    from parascale import safejson
    from parascale.comm.config import RECORD_NAME, CommConfig
    from parascale.comm.measure import run as measure_comm
    from parascale.safejson import Refused

    file = folder / RECORD_NAME
    if rerun != "always" and file.is_file():
        try:
            return dict(safejson.load(file))
        except Refused:
            pass
    sizes = tuple(sorted({max(1024, int(size * f)) for f in (0.25, 0.5, 1.0, 2.0, 4.0)}))
    echo(f"measuring the link: allreduce on {workers} workers at {len(sizes)} sizes")
    return measure_comm(CommConfig(workers=workers, sizes=sizes, ops=("allreduce",),
                                   warmup=2, iters=30, min_iters=5, seconds_per_point=0.15,
                                   out=str(folder)))
