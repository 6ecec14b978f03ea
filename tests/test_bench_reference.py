"""A study without a one-worker run never invents a speedup: bare bench plans one, and a plan
without it says there is nothing to compare against."""

import json

import pytest

from parascale.cli.main import main


def test_bare_bench_plans_a_scaling_study_with_a_one_worker_reference(tmp_path, capsys):
    study = tmp_path / "bare"
    assert main(["bench", "--model", "mlp", "--steps", "2", "--dry-run", "--out", str(study)]) == 0
    out = capsys.readouterr().out
    assert "weak scaling study" in out and "workers-1__" in out, out  # a 1-worker run is planned
    assert not study.exists()


def test_the_note_before_a_plan_without_one_worker_promises_no_speedup():
    from types import SimpleNamespace

    from parascale.bench.study import reference_warning

    jobs = [SimpleNamespace(world_size=n, skip_reason=None) for n in (2, 4)]
    note = reference_warning(jobs)
    assert "no speedup" in note and "relative to 2 workers" in note
    assert "scaled perfectly" not in note  # the old note promised a speedup on that assumption
    assert reference_warning([SimpleNamespace(world_size=1, skip_reason=None)]) is None


@pytest.mark.slow
def test_bare_bench_summary_never_invents_a_speedup(tmp_path, capsys):
    """The user's case: bench with no study options, then its summary."""
    study = tmp_path / "bare"
    assert main(["bench", "--model", "mlp", "--steps", "2", "--timeout", "60",
                 "--out", str(study)]) == 0
    out = capsys.readouterr().out
    assert "assumes those scaled perfectly" not in out and "relative to 2 workers" not in out
    found = [json.loads(p.read_text()) for p in study.glob("runs/*/record.json")]
    assert {r["derived"]["world_size"] for r in found} >= {1}
    assert "weak scaling" in out and "the throughput of 1" in out  # the verdict, measured
