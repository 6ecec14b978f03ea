"""--profile A:B: one Chrome/Perfetto trace per rank in DIR/traces, written by torch.profiler,
with parascale's phases as named ranges, and the record's ``profile`` section that lists them and
says honestly when the window was not (all) traced. Bad values are one line before any worker."""
from __future__ import annotations

import json

import pytest

import parascale
from conftest import run_training
from parascale.cli.main import main
from parascale.errors import UsageError

# digits at global batch 256: 5 steps an epoch, so a few steps take about a second
RUN = dict(workers=2, global_batch=256, seed=3, timeout=30.0)
PHASES = {f"parascale.{name}" for name in ("data", "compute", "sync", "optimizer")}


def trace_names(path) -> set[str]:
    trace = json.loads(path.read_text())
    assert isinstance(trace["traceEvents"], list)  # Chrome's trace format, as Perfetto reads it
    return {event.get("name") for event in trace["traceEvents"]}


@pytest.mark.slow
def test_two_workers_write_one_trace_each_with_the_phases_as_named_ranges(tmp_path):
    out = tmp_path / "run"
    record, _ = run_training(out, steps=12, profile="7:8", **RUN)  # in epoch 2 of 3
    assert record["profile"] == {
        "steps": [7, 8], "profiled": [7, 8], "profiled_steps": 2,
        "traces": ["traces/rank-0.json", "traces/rank-1.json"], "complete": True, "note": None}
    assert sorted(p.name for p in (out / "traces").iterdir()) == ["rank-0.json", "rank-1.json"]
    for rank in (0, 1):
        names = trace_names(out / "traces" / f"rank-{rank}.json")
        assert PHASES <= names
        steps = {n for n in names if n.startswith("parascale.step ")}
        assert steps == {"parascale.step 7", "parascale.step 8"}  # the window, no more
    assert "parascale: traces of steps 7-8 written to " in (out / "log.txt").read_text()
    # the profiler slowed epoch 2: it is no steady figure
    assert [e.get("profiled", False) for e in record["epochs"]] == [False, True, False]
    assert record["steps"]["excluded"] == "epoch 1 (warm-up) and epoch 2 (profiled)"
    assert record["summary"]["steady_source"] == "the steps of epoch 3"
    assert "epoch 2/3 (profiled): " in (out / "log.txt").read_text()


@pytest.mark.slow
def test_a_window_past_the_last_step_is_traced_as_far_as_training_went(tmp_path):
    out = tmp_path / "run"
    record, _ = run_training(out, steps=4, profile="3:8", **RUN)
    assert record["profile"] == {
        "steps": [3, 8], "profiled": [3, 4], "profiled_steps": 2,
        "traces": ["traces/rank-0.json", "traces/rank-1.json"], "complete": False,
        "note": "training ended at step 4, before step 8"}
    assert {"parascale.step 3", "parascale.step 4"} <= trace_names(out / "traces/rank-1.json")


@pytest.mark.slow
def test_a_window_after_the_last_step_says_so_and_writes_no_trace(tmp_path):
    out = tmp_path / "run"
    record, _ = run_training(out, steps=3, profile="5:9", **RUN)
    assert record["profile"] == {
        "steps": [5, 9], "profiled": None, "profiled_steps": 0, "traces": [], "complete": False,
        "note": "training ended at step 3, before step 9; no trace was written"}
    assert not (out / "traces").exists()
    assert "parascale: no traces of steps 5-9 (training ended at step 3" in \
        (out / "log.txt").read_text()


@pytest.mark.slow
def test_a_restart_keeps_the_earlier_attempts_traces_of_a_window_it_passed(tmp_path,
                                                                         monkeypatch):
    # the first attempt traces steps 2-4 and fails before step 5; the restart continues from
    # the checkpoint after step 3, inside the window, and keeps the fuller trace it finds
    monkeypatch.setenv("PARASCALE_FAULT", "raise@1:5")
    out = tmp_path / "run"
    record, _ = run_training(out, steps=6, profile="2:4", checkpoint_every=3, max_restarts=1,
                             **RUN)
    assert record["restarts"][0]["from_step"] == 3
    assert record["profile"] == {
        "steps": [2, 4], "profiled": [2, 4], "profiled_steps": 3,
        "traces": ["traces/rank-0.json", "traces/rank-1.json"], "complete": True,
        "note": "the run resumed after step 3; the traces are an earlier attempt's"}
    names = trace_names(out / "traces/rank-0.json")
    assert {n for n in names if n.startswith("parascale.step ")} == \
        {f"parascale.step {n}" for n in (2, 3, 4)}


@pytest.mark.slow
def test_a_run_without_profile_is_unchanged(tmp_path):
    out = tmp_path / "run"
    record, _ = run_training(out, steps=2, **RUN)
    assert record["profile"] is None
    assert not (out / "traces").exists()
    assert "traces" not in (out / "log.txt").read_text()


@pytest.mark.parametrize("value", ["0:3", "5:2", "abc", "3", "2:", ":4", "-1:2", "1:2:3",
                                   "\uff11:2"])  # a fullwidth 1: isdigit, yet no count
def test_a_bad_window_is_one_line_exit_2_and_nothing_written(capsys, tmp_path, value):
    out = tmp_path / "run"
    code = main(["train", f"--profile={value}", "--out", str(out)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("parascale: error: --profile is a range of optimizer steps "
                               "FIRST:LAST") and repr(value) in lines[0]
    assert not out.exists()


def test_the_api_needs_a_folder_for_the_traces():
    with pytest.raises(UsageError, match="--profile needs --out: the traces are written into "
                                         "DIR/traces"):
        parascale.train({"profile": "2:3"})


def test_a_run_folder_gets_the_new_runs_set_whole(tmp_path):
    """What staging and the bench runner move into a run's folder: traces/ replaces the old
    folder whole (no stale rank files), and a name the new run lacks goes (the set is one run's)."""
    from parascale.runtime.staging import replace_set

    new, final = tmp_path / "new", tmp_path / "final"
    (new / "traces").mkdir(parents=True)
    (new / "traces" / "rank-0.json").write_text("{}")
    (new / "log.txt").write_text("new log")
    (final / "traces").mkdir(parents=True)
    (final / "traces" / "rank-3.json").write_text("old")
    (final / "model.pt").write_text("old model")
    replace_set(new, final, ("model.pt", "log.txt", "traces"))
    assert sorted(p.name for p in (final / "traces").iterdir()) == ["rank-0.json"]
    assert (final / "log.txt").read_text() == "new log"
    assert not (final / "model.pt").exists()
