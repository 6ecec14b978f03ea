"""``--verify K``: the recommendation and the K next configurations run here as a real study
(``bench``'s runner, in OUT/verify, resumable), and their predicted time to the goal set
beside the measured one: the advice grades itself.

Measured as parascale measures it: a target's time is the record's ``time_to_accuracy.elapsed_s``
(training time to the evaluation that reached it); a budget's is the whole training time
(``summary.total_time_s``), the run given the steps the prediction spends.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parascale.advise import measure
from parascale.advise.forecast import Forecast
from parascale.advise.output import run_options, seconds
from parascale.advise.rank import Advice
from parascale.columns import aligned


def cases(forecasts: list[Forecast], job: dict[str, Any], target: bool,
          cap_samples: float | None, threads: int | None = None) -> list[dict[str, Any]]:
    """Each forecast's run: its train options (its workers with the ``threads`` each was
    measured with), stopping at the target within the job's budget, or training the steps
    its budget takes."""
    found = []
    for f in forecasts:
        options = run_options(f, job, True, threads)
        batch = f.candidate.global_batch
        if target:
            options["stop_at_target"] = True
            if job.get("steps") and cap_samples:
                options.update(steps=math.ceil(cap_samples / batch), epochs=None)
        else:
            assert f.timing is not None
            options.update(steps=int(f.timing.steps), epochs=None, stop_at_target=False,
                           target_metric=None, target_value=None, target_accuracy=None)
        flat = dict(options.pop("sync_options"))
        found.append({**options, **flat})
    return found


def measured(record: dict[str, Any], target: bool) -> float | None:
    if record.get("status") != "ok":
        return None
    if target:
        tta = record.get("time_to_accuracy") or {}
        return float(tta["elapsed_s"]) if tta.get("reached") else None
    total = (record.get("summary") or {}).get("total_time_s")
    return float(total) if isinstance(total, (int, float)) else None


def chosen_for(advice: Advice, count: int) -> list[Forecast]:
    """The recommendation, then the ``count`` next feasible configurations in rank."""
    first = advice.recommended
    rest = [f for f in advice.forecasts if f.feasible and f is not first]
    return ([first] if first is not None else []) + rest[:count]


def run(advice: Advice, job: dict[str, Any], chosen: list[Forecast], folder: Path,
        target: bool, echo: Callable[[str], None], rerun: str = "never",
        quiet_max_s: float | None = None) -> list[dict[str, Any]]:
    """Run the ``chosen`` configurations (:func:`chosen_for`) as one study; the checks, in
    their order, each with its rank in the advice."""
    from parascale.bench.runner import run_study
    from parascale.bench.study import StudyInputs, make_jobs

    runs = cases(chosen, job, target, advice.basis.stats.cap_samples, advice.basis.threads)
    base = {k: v for k, v in job.items()}
    inputs = StudyInputs(parameters=base, extensions=[{"cases": runs}])
    jobs = make_jobs(inputs)
    echo(f"verifying: {len(jobs)} configuration(s) in {folder}")
    records = run_study(folder, jobs, rerun, echo, inputs=dataclasses.asdict(inputs),
                        quiet_max_s=quiet_max_s)
    checks = []
    for f, case in zip(chosen, runs):
        rank = advice.forecasts.index(f) + 1
        ran = measure.job_of(jobs, runs, case, base)
        record = records[ran.folder]
        got = measured(record, target)
        machine = record.get("machine") or {}
        steps = record.get("steps") or {}
        tta = record.get("time_to_accuracy") or {}
        checks.append({"rank": rank, "configuration": f.candidate.label,
                       "recommended": f is advice.recommended,
                       "predicted_step_s": f.step.step_s if f.step else None,
                       "measured_step_s": ((steps.get("phases") or {}).get("step") or {}).get(
                           "mean"),
                       "predicted_epochs": f.timing.epochs if f.timing else None,
                       "measured_epochs": tta.get("epoch") if target else None,
                       "predicted_s": f.time_s, "low_s": f.low_s, "high_s": f.high_s,
                       "measured_s": got, "status": record.get("status"),
                       "reason": (record.get("reason") or "not within the job's budget")
                       if got is None else None,
                       "error": (f.time_s - got) / got if got else None,
                       "within_band": (f.low_s <= got <= f.high_s) if got else None,
                       "busy": machine.get("busy") is True,
                       "record": str(folder / "runs" / ran.folder / "record.json")})
    return checks


def table(checks: list[dict[str, Any]]) -> str:
    """Predicted beside measured, with the step and the epochs apart: which of the two a miss
    comes from."""
    rows = [["rank", "configuration", "predicted", "band", "measured", "error",
             "step ms pred/meas", "epochs pred/meas", "note"]]
    for c in checks:
        got = c["measured_s"]
        notes = ["recommended"] if c.get("recommended") else []
        if c["busy"]:
            notes.append("busy machine")
        if got is None:
            notes.append(f"not reached: {c['reason'] or c['status']}")
        step = "/".join("-" if v is None else f"{v * 1e3:.3g}"
                        for v in (c.get("predicted_step_s"), c.get("measured_step_s")))
        epochs = "/".join("-" if v is None else f"{v:g}"
                          for v in (c.get("predicted_epochs"), c.get("measured_epochs")))
        rows.append([str(c["rank"]), c["configuration"], seconds(c["predicted_s"]),
                     f"{seconds(c['low_s'])}-{seconds(c['high_s'])}",
                     seconds(got) if got is not None else "-",
                     f"{c['error']:+.0%}" if c["error"] is not None else "-", step, epochs,
                     "; ".join(notes)])
    done = [c for c in checks if c["measured_s"] is not None]
    lines = ["predicted against measured time to the goal (this machine):", aligned(rows)]
    if done:
        fastest = min(done, key=lambda c: c["measured_s"])
        lines.append(f"fastest measured: rank {fastest['rank']} ({fastest['configuration']}, "
                     f"{seconds(fastest['measured_s'])})")
        within = sum(abs(c["error"]) <= 0.25 for c in done)
        lines.append(f"{within} of {len(done)} predicted within 25% of the measured time")
    return "\n".join(lines)
