"""A study folder's report shows the runs of its plan only.

``parascale bench`` writes ``STUDY/plan.json`` with the folder of every run it plans. When a
folder was used for another plan before (``parascale demo --quick`` then ``parascale demo``, or
a study whose settings changed), ``runs/`` still holds the earlier plan's records; mixing them
into the tables would compare unlike runs and pass the mixture off as one study. They are set
apart here (``Loaded.outside``) and listed as not in the plan, never silently dropped. A folder
without a readable plan.json (a folder of train runs, an older study) is taken whole.
"""
from __future__ import annotations

from pathlib import Path

from parascale.report.load import Loaded, Problem, RunRecord
from parascale.safejson import Refused, read_plan

PLAN = "plan.json"


def planned_folders(study: Path) -> set[str] | None:
    """The run folders STUDY/plan.json lists, or None when there is no usable plan."""
    try:
        plan = read_plan(study / PLAN)
    except Refused:
        return None
    return {r["folder"] for r in plan["runs"]
            if isinstance(r, dict) and isinstance(r.get("folder"), str)}


def keep_planned(loaded: Loaded) -> Loaded:
    """Move the records (and run folders without one) that their study's plan does not list
    into ``loaded.outside``; returns ``loaded``."""
    for source in loaded.sources:
        folders = planned_folders(source.path) if source.path.is_dir() else None
        if folders is None:
            continue
        runs = (source.path / "runs").resolve()

        # called at once, in this iteration, by the comprehension below
        def outside(path: Path, label: str) -> bool:
            folder = path.parent if path.name == "record.json" else path
            return label == source.label and folder.resolve().parent == runs \
                and folder.name not in folders  # noqa: B023

        apart: list[RunRecord | Problem] = [r for r in loaded.records
                                            if outside(r.path, r.study)]
        apart += [p for p in loaded.problems if outside(p.path, p.study)]
        loaded.records = [r for r in loaded.records if r not in apart]
        loaded.problems = [p for p in loaded.problems if p not in apart]
        loaded.outside += apart
    return loaded


def outside_lines(loaded: Loaded) -> list[str]:
    """One line per run set apart: what it was and where it is."""
    return [f"{item.describe()} ({item.path})" if isinstance(item, RunRecord)
            else f"{item.path}: {item.reason}" for item in loaded.outside]
