"""Scaling studies: planning arithmetic, the CLI contract, and real studies on gloo (no mocks)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import parascale
from conftest import record as run_record
from helpers import TINY
from parascale.bench.runner import StudyRunner, run_study
from parascale.bench.study import combine, make_jobs
from parascale.cli.main import main
from parascale.config import SECTIONS
from parascale.errors import UsageError


def records(study: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text())
            for p in sorted((study / "runs").glob("*/record.json"))}


# --- planning: no training ----------------------------------------------------------------------

def test_weak_scaling_keeps_the_per_device_batch():
    jobs = make_jobs(combine(options={**TINY, "batch_size": 16}, scaling="weak", workers="1,2"))
    assert [(j.world_size, j.per_device_batch, j.global_batch) for j in jobs] == [
        (1, 16, 16), (2, 16, 32)]
    assert all(j.scaling == "weak" and j.skip_reason is None for j in jobs)
    assert len({j.config_id for j in jobs}) == 2


def test_strong_scaling_divides_the_global_batch_or_skips_with_the_reason():
    jobs = make_jobs(combine(options={**TINY, "global_batch": 64}, scaling="strong",
                             workers="1,2"))
    assert [(j.world_size, j.per_device_batch, j.global_batch) for j in jobs] == [
        (1, 64, 64), (2, 32, 64)]
    odd = make_jobs(combine(options={**TINY, "global_batch": 63}, scaling="strong",
                            workers="1,2"))
    assert odd[0].skip_reason is None and odd[0].per_device_batch == 63
    assert odd[1].skip_reason == "global batch 63 does not divide by 2 workers"
    # accumulation steps count too: 30 does not divide into 1 worker x 4 micro-batches
    acc = make_jobs(combine(options={**TINY, "global_batch": 30, "accumulate": 4},
                            scaling="strong", workers="1"))
    assert "does not divide by 1 workers x 4 accumulation steps" in acc[0].skip_reason


def test_scaling_mode_needs_its_batch():
    with pytest.raises(UsageError, match="weak scaling fixes the per-device batch"):
        make_jobs(combine(options={**TINY, "global_batch": 64}, scaling="weak", workers="1"))
    with pytest.raises(UsageError, match="strong scaling fixes the global batch"):
        make_jobs(combine(options={**TINY, "batch_size": 8}, scaling="strong", workers="1"))


def test_dlbs_style_computed_batch_and_helper_parameter():
    jobs = make_jobs(combine(options=TINY, assignments=[
        ("effective", 64), ("batch_size", "$(${effective} / ${workers})$")],
        variables=[("workers", [1, 2])]))
    # 64 / 2 is 32.0: an integral float is accepted for an integer option
    assert [(j.world_size, j.per_device_batch, j.train["batch_size"]) for j in jobs] == [
        (1, 64, 64), (2, 32, 32)]
    assert "effective" not in jobs[0].train and jobs[0].params["effective"] == 64


def test_baseline_and_repeats_expand_the_plan():
    jobs = make_jobs(combine(options={**TINY, "batch_size": 8}, scaling="weak", workers="1,2",
                             repeat=2, baseline=True))
    one, two = jobs[0].config_id, jobs[1].config_id
    assert [(j.folder, j.config_id, j.repeat, j.baseline) for j in jobs] == [
        (one, one, 1, False), (two, two, 1, False),
        (f"{two}-baseline", f"{two}-baseline", 1, True),
        (f"{one}-r2", one, 2, False), (f"{two}-r2", two, 2, False),
        (f"{two}-baseline-r2", f"{two}-baseline", 2, True)]
    assert jobs[2].train["sync"] == "none" and "sync" not in jobs[1].train
    assert jobs[0].world_size == 1  # no baseline for one worker: nothing to synchronise


def test_typo_in_a_parameter_is_exit_2_naming_the_option(tmp_path, capsys):
    study = tmp_path / "study"
    code = main(["bench", "-P", "btach_size=8", "--model", "mlp", "--out", str(study)])
    assert code == 2
    err = capsys.readouterr().err
    assert "btach_size" in err and "did you mean batch_size" in err
    assert len(err.strip().splitlines()) == 1
    assert not study.exists()


def test_bad_value_in_one_configuration_fails_before_anything_runs(tmp_path, capsys):
    study = tmp_path / "study"
    code = main(["bench", "--model", "mlp", "--steps", "2", "-V", "batch_size=8,-1",
                 "--out", str(study)])
    assert code == 2
    assert "--batch-size must be a positive int" in capsys.readouterr().err
    assert not study.exists()


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    study_file = tmp_path / "study.yaml"
    study_file.write_text(
        "parameters: {model: mlp, steps: 2, global_batch: 64}\n"
        "variables: {workers: [1, 2], lr: [0.1, 0.2]}\n"
        "extensions:\n"
        "  - condition: ${lr} > 0.15 and ${workers} == 2\n"
        "    skip: too hot for ${workers} workers\n")
    study = tmp_path / "study"
    code = main(["bench", "--config", str(study_file), "-P", "scaling=strong", "--dry-run",
                 "--out", str(study)])
    out = capsys.readouterr().out
    assert code == 0 and not study.exists()
    assert "4 runs: 3 planned, 1 skipped" in out
    assert "skipped: too hot for 2 workers" in out
    assert "dry run: nothing was run or written" in out


def test_a_study_folder_takes_one_bench_at_a_time(tmp_path, capsys):
    from parascale.bench.runner import _locked

    study = tmp_path / "busy"
    study.mkdir()
    with _locked(study):
        code = main(["bench", "--model", "mlp", "--workers", "1", "--steps", "2",
                     "--out", str(study)])
    assert code == 2
    assert "another parascale bench is running on" in capsys.readouterr().err
    assert not (study / "runs").exists()


# --- real studies ----------------------------------------------------------------------------

@pytest.mark.slow
def test_two_configuration_study_end_to_end(tmp_path, capsys):
    study = tmp_path / "weak"
    argv = ["bench", "--model", "mlp", "--dataset", "digits", "--scaling", "weak",
            "--workers", "1,2", "--batch-size", "16", "--steps", "4", "--baseline",
            "--timeout", "60", "--out", str(study)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    found = records(study)
    assert len(found) == 3
    for folder, record in found.items():
        assert record["status"] == "ok"
        assert record["study"]["name"] == "weak" and record["study"]["scaling"] == "weak"
        assert record["study"]["config_id"] == folder and record["study"]["repeat"] == 1
        assert record["config"]["out"] == str(study / "runs" / folder)
        assert not (study / "runs" / folder / "model.pt").exists()
    by_n = {(r["derived"]["world_size"], r["study"]["baseline"]): r for r in found.values()}
    assert set(by_n) == {(1, False), (2, False), (2, True)}
    assert by_n[(2, True)]["config"]["sync"] == "none"
    assert by_n[(2, False)]["derived"]["global_batch"] == 32
    plan = json.loads((study / "plan.json").read_text())
    assert sorted(r["folder"] for r in plan["runs"]) == sorted(found)
    assert (study / "report" / "report.html").is_file()
    summary = (study / "summary.txt").read_text()
    assert "t1/tN" in summary and summary.strip() in out  # the table as printed
    assert "[1/3]" in out and "weak scaling" in out and "t1/tN" in out
    assert f"report: {study / 'report' / 'report.html'}" in out
    assert not (study / ".running").exists()

    # the same command again re-uses every run
    mtimes = {f: (study / "runs" / f / "record.json").stat().st_mtime_ns for f in found}
    assert main(argv) == 0
    assert "3 of 3 runs already done in" in capsys.readouterr().out
    assert mtimes == {f: (study / "runs" / f / "record.json").stat().st_mtime_ns for f in found}


@pytest.mark.slow
def test_out_of_memory_skips_larger_batches_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCALE_FAULT", "oom@16")
    jobs = make_jobs(combine(options=TINY, variables=[("batch_size", [32, 8, 16])],
                             scaling="weak", workers="1"))
    lines: list[str] = []
    result = run_study(tmp_path / "oom", jobs, echo=lines.append)
    by_batch = {r["config"]["batch_size"]: r for r in result.values()}
    assert [r["config"]["batch_size"] for r in result.values()] == [8, 16, 32]  # smallest first
    assert by_batch[8]["status"] == "ok"
    assert by_batch[16]["status"] == "oom"
    skipped = by_batch[32]
    oom_id = by_batch[16]["study"]["config_id"]
    assert skipped["status"] == "skipped"
    assert skipped["reason"] == (f"not run: per-device batch 32 is larger than 16, which ran "
                                 f"out of memory in {oom_id}")
    assert skipped["study"]["scaling"] == "weak" and skipped["derived"]["world_size"] == 1
    assert skipped["config"]["model"] == "mlp" and skipped["config"]["batch_size"] == 32
    assert any("skipped (not run: per-device batch 32" in line for line in lines)
    assert records(tmp_path / "oom") == {r["study"]["config_id"]: r for r in result.values()}


@pytest.mark.slow
def test_rerun_failed_runs_a_failed_configuration_again(tmp_path, monkeypatch, capsys):
    study = tmp_path / "flaky"
    argv = ["bench", "--model", "mlp", "--workers", "1", "--batch-size", "8", "--steps", "2",
            "--timeout", "60", "--out", str(study)]
    monkeypatch.setenv("PARASCALE_FAULT", "raise@0:1")
    assert main(argv) == 1
    assert "1 of 1 runs failed" in capsys.readouterr().err
    (first,) = records(study).values()
    assert first["status"] == "failed" and "injected fault" in first["reason"]
    monkeypatch.delenv("PARASCALE_FAULT")
    assert main(argv) == 1  # --rerun never keeps the failed record
    assert "--rerun failed runs those again" in capsys.readouterr().out
    assert main(argv + ["--rerun", "failed"]) == 0
    (second,) = records(study).values()
    assert second["status"] == "ok" and second["study"] == first["study"]

    # --repeat 2 keeps the first run and adds a second in <config>-r2
    assert main(argv + ["--repeat", "2"]) == 0
    assert "1 of 2 runs already done" in capsys.readouterr().out
    found = records(study)
    folder = second["study"]["config_id"]
    assert sorted(found) == [folder, f"{folder}-r2"]
    assert found[folder] == second
    assert found[f"{folder}-r2"]["study"]["repeat"] == 2
    assert found[f"{folder}-r2"]["study"]["config_id"] == folder


def test_a_strategy_option_applies_only_to_its_strategy_in_a_comparison():
    jobs = make_jobs(combine(options={**TINY, "batch_size": 8}, assignments=[("period", 4)],
                             variables=[("sync", ["allreduce", "local-sgd"])], workers="2"))
    by_sync = {job.train.get("sync"): job for job in jobs}
    assert "period" not in by_sync["allreduce"].train
    assert by_sync["local-sgd"].train["period"] == 4
    assert by_sync["allreduce"].params["period"] == 4  # still recorded as a study value
    # without any local-sgd configuration the option is a mistake, and said so
    with pytest.raises(UsageError, match="--period 4 belongs to --sync local-sgd"):
        make_jobs(combine(options={**TINY, "batch_size": 8}, assignments=[("period", 4)],
                          workers="2"))


def test_a_study_builds_each_data_set_once_and_probes_each_model_once(monkeypatch):
    built = {"data": 0, "model": 0}

    def counting(kind, real):
        def wrapper(*args, **kwargs):
            built[kind] += 1
            return real(*args, **kwargs)
        return wrapper

    from parascale.data import builtin, handover

    monkeypatch.setattr(handover, "_PREPARED", {})  # nothing built earlier in this process
    monkeypatch.setattr(builtin, "build", counting("data", builtin.build))
    monkeypatch.setattr(parascale.models, "build", counting("model", parascale.models.build))
    options = {**TINY, "batch_size": 8}
    del options["model"]
    jobs = make_jobs(combine(options=options, workers="1",
                             variables=[("lr", [0.01, 0.02, 0.03, 0.04]),
                                        ("model", ["mlp", "smallcnn"])]))
    assert len(jobs) == 8
    assert built == {"data": 1, "model": 2}


def test_configurations_with_different_data_are_checked_against_their_own_data():
    with pytest.raises(UsageError, match="synthetic has 48"):
        make_jobs(combine(options={**TINY, "dataset": "synthetic", "batch_size": 64},
                          workers="1", variables=[("synthetic_size", [2048, 48])]))


def test_the_data_key_covers_every_field_a_loader_reads():
    source = "".join(p.read_text() for p in Path(parascale.data.__file__).parent.glob("*.py"))
    read = set(re.findall(rf"\bcfg\.(?:{'|'.join(SECTIONS)})\.([a-z_]+)", source))
    assert read and read <= set(parascale.data.FIELDS), read - set(parascale.data.FIELDS)


def test_a_runs_line_names_its_judging_metric_and_nothing_unevaluated():
    image = run_record(1, 100.0, accuracy=0.9)
    image["summary"]["final_test_accuracy"] = 0.93
    assert StudyRunner._outcome(image, 1.0).endswith("100 samples/s, test accuracy 93.00%")
    lm = run_record(1, 100.0)
    lm["task"] = {"judge": "loss", "unit": "tokens", "units_per_sample": 64.0}
    lm["summary"].update(final_test_accuracy=None, final_metrics={"val_loss": 1.87})
    assert StudyRunner._outcome(lm, 1.0).endswith("6,400 tokens/s, validation loss 1.8700")
    lm["summary"]["final_metrics"] = {}  # neither split evaluated: no figure, not 0.0%
    assert StudyRunner._outcome(lm, 1.0).endswith("6,400 tokens/s")
