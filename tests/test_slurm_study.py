"""A study's Slurm jobs without a cluster: the scheduler's answers are stated, and what status
files, and what a second submission sends, are checked against them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from parascale.bench.runner import StudyRunner, planned_jobs
from parascale.bench.session import plan_from_args
from parascale.cli.main import build_parser
from parascale.cli.options import config_from_args
from parascale.cluster import scheduler
from parascale.cluster import study as slurm_study
from parascale.cluster.scheduler import JobState
from parascale.cluster.script import SlurmOptions


@pytest.fixture
def planned(tmp_path, monkeypatch):
    """A two-configuration study whose plan is written, and a scheduler that says what
    ``answers`` holds and records what is submitted."""
    study = tmp_path / "study"
    args = build_parser(["bench"]).parse_args(
        ["bench", "--workers", "1,2", "--scaling", "weak", "--batch-size", "16", "--steps", "2",
         "--out", str(study)])
    inputs, jobs, _ = plan_from_args(args, config_from_args(args))
    StudyRunner(study, jobs).prepare()
    answers: dict[str, JobState] = {}
    sent: list[Path] = []
    monkeypatch.setattr(scheduler, "states", lambda ids, outputs=None: {
        i: answers.get(i, JobState(i, "UNKNOWN", source="none")) for i in ids})

    def submit(path: Path) -> str:
        sent.append(path)
        return str(200 + len(sent))

    monkeypatch.setattr(scheduler, "submit", submit)
    return study, planned_jobs(study), answers, sent


def rows(study, jobs):
    return {row.folder: row for row in slurm_study.refresh(study, jobs)}


def read(study: Path, folder: str) -> dict:
    return json.loads((study / "runs" / folder / "record.json").read_text())


def test_plan_round_trip_gives_the_runner_the_same_jobs(planned):
    study, jobs, _, _ = planned
    assert [(j.folder, j.world_size, j.train["batch_size"]) for j in jobs] == \
        [(jobs[0].folder, 1, 16), (jobs[1].folder, 2, 16)]


def test_a_job_that_ended_without_filing_is_filed_failed_with_the_schedulers_reason(planned):
    study, jobs, answers, _ = planned
    one, two = (j.folder for j in jobs)
    slurm_study.write_ledger(study, {one: {"job_id": "101"}, two: {"job_id": "102"}})
    answers["101"] = JobState("101", "RUNNING", source="scontrol")
    answers["102"] = JobState("102", "TIMEOUT", "TimeLimit, exit code 0:15", "scontrol")
    shown = rows(study, jobs)
    assert shown[one].active and shown[one].outcome == "" and not (study / "runs" / one).exists()
    assert shown[two].state == "TIMEOUT" and shown[two].outcome == "failed"
    record = read(study, two)
    assert record["status"] == "failed" and record["study"]["config_id"] == two
    assert record["reason"].startswith("Slurm job 102 ended without filing its run: TIMEOUT "
                                       "(TimeLimit, exit code 0:15); output in ")
    assert slurm_study.filed_by(study, two) == "102"
    # a second look files nothing again (the marker names the job)
    (study / "runs" / two / "record.json").write_text(json.dumps({**record, "reason": "kept"}))
    assert rows(study, jobs)[two].outcome == "failed" and read(study, two)["reason"] == "kept"


def test_a_job_the_scheduler_forgot_is_filed_as_unknown(planned):
    study, jobs, _, _ = planned
    slurm_study.write_ledger(study, {jobs[0].folder: {"job_id": "77"}})
    assert rows(study, jobs)[jobs[0].folder].outcome == "failed"
    assert "UNKNOWN: the scheduler no longer remembers it" in read(study, jobs[0].folder)["reason"]


def test_a_finished_run_left_in_staging_is_filed_not_failed(planned):
    study, jobs, answers, _ = planned
    folder = jobs[1].folder
    StudyRunner(study, jobs).file_elsewhere(jobs[1], "first")  # a failed record to move aside
    staged = read(study, folder) | {"status": "ok", "reason": None}
    (study / ".running" / folder).mkdir(parents=True)
    (study / ".running" / folder / "record.json").write_text(json.dumps(staged))
    slurm_study.write_ledger(study, {folder: {"job_id": "5"}})
    answers["5"] = JobState("5", "CANCELLED", source="scontrol")  # cancelled after training
    assert rows(study, jobs)[folder].outcome == "ok"
    assert read(study, folder)["status"] == "ok" and not (study / ".running" / folder).exists()


def test_submitting_again_sends_only_what_is_missing_or_failed(planned, tmp_path):
    study, jobs, answers, sent = planned
    one, two = (j.folder for j in jobs)
    opts = SlurmOptions(python="python3")
    lines: list[str] = []
    assert slurm_study.submit(study, jobs, opts, "failed", None, lines.append) == ["201", "202"]
    assert [p.name for p in sent] == [f"{one}.sh", f"{two}.sh"]
    assert (study / "slurm" / f"{one}.sh").read_text() == slurm_study.study_script(study, jobs[0],
                                                                                   opts)
    # while both are queued, nothing is sent again
    answers.update({i: JobState(i, "PENDING", "Resources", "scontrol") for i in ("201", "202")})
    assert slurm_study.submit(study, jobs, opts, "failed", None, lines.append) == []
    assert f"{one}: job 201 is pending, left alone" in lines
    # one finished and filed itself, the other failed by itself: only that one goes again
    StudyRunner(study, jobs).file_elsewhere(jobs[1], "Slurm job 202: srun exited with code 1")
    slurm_study.mark_filed(study, two, "202")
    (study / ".running" / one).mkdir(parents=True)
    ok = read(study, two) | {"status": "ok", "reason": None}
    (study / ".running" / one / "record.json").write_text(json.dumps(ok))
    StudyRunner(study, jobs).file_elsewhere(jobs[0], "unused")
    slurm_study.mark_filed(study, one, "201")
    answers.update({"201": JobState("201", "COMPLETED", source="scontrol"),
                    "202": JobState("202", "FAILED", "NonZeroExitCode", "scontrol")})
    assert slurm_study.submit(study, jobs, opts, "failed", None, lines.append) == ["203"]
    assert slurm_study.read_ledger(study)[two]["job_id"] == "203"
    assert f"{one}: recorded (ok), kept (--rerun failed)" in lines
    # --rerun never keeps the failed one too
    answers["203"] = JobState("203", "FAILED", "NonZeroExitCode", "scontrol")
    assert slurm_study.submit(study, jobs, opts, "never", None, lines.append) == []


def test_a_record_the_job_filed_stands_when_its_marker_is_missing(planned):
    """A job killed between filing its record and writing its marker: the record it filed is
    kept (ok, or its own failure), never replaced by a guess; only an earlier job's failure is."""
    study, jobs, answers, _ = planned
    one, two = (j.folder for j in jobs)
    StudyRunner(study, jobs).file_elsewhere(jobs[0], "first")  # a record to make an ok one of
    (study / ".running" / one).mkdir(parents=True)
    (study / ".running" / one / "record.json").write_text(
        json.dumps(read(study, one) | {"status": "ok", "reason": None}))
    StudyRunner(study, jobs).file_elsewhere(jobs[0], "unused")  # filed ok, as filing does
    StudyRunner(study, jobs).file_elsewhere(jobs[1], "Slurm job 302: srun exited with code 1")
    slurm_study.write_ledger(study, {one: {"job_id": "301"}, two: {"job_id": "302"}})
    answers["301"] = JobState("301", "COMPLETED", source="scontrol")
    answers["302"] = JobState("302", "FAILED", "NonZeroExitCode", "scontrol")
    shown = rows(study, jobs)
    assert shown[one].outcome == "ok" and read(study, one)["status"] == "ok"
    assert shown[two].outcome == "failed"
    assert read(study, two)["reason"] == "Slurm job 302: srun exited with code 1"
    assert slurm_study.filed_by(study, one) == "301" and slurm_study.filed_by(study, two) == "302"
    # a failed record of an earlier job is what a new job replaces
    slurm_study.write_ledger(study, {two: {"job_id": "303"}})
    answers["303"] = JobState("303", "CANCELLED", source="scontrol")
    assert rows(study, jobs)[two].outcome == "failed"
    assert read(study, two)["reason"].startswith("Slurm job 303 ended without filing its run: "
                                                 "CANCELLED")


def test_a_data_folder_only_the_nodes_mount_plans_with_one_warning(tmp_path, capsys,
                                                                    monkeypatch):
    """Like slurm train: the study's jobs read --data-dir on the nodes; the plan says so once,
    however many configurations share it, and renders every job."""
    from parascale.cli.main import main

    monkeypatch.setattr(scheduler, "cpus_per_node", lambda partition: None)  # no sinfo here

    data = tmp_path / "scratch" / "cifar10"  # not on this machine
    assert main(["slurm", "bench", "--dataset", "cifar10", "--data-dir", str(data),
                 "--workers", "1,2", "--steps", "2", "--out", str(tmp_path / "s"),
                 "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        (f"parascale: warning: --data-dir {data} is not on this machine; the jobs read it on "
         "the nodes (and say so if it is missing there too)")]
    assert captured.out.count(f"--data-dir {data}") == 2
    assert list(tmp_path.iterdir()) == []
    # a folder that is here is checked here; and a local study checks it always
    data.parent.mkdir()
    data.write_text("")
    assert main(["slurm", "bench", "--dataset", "cifar10", "--data-dir", str(data),
                 "--workers", "1", "--steps", "2", "--dry-run"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["bench", "--dataset", "cifar10", "--data-dir", str(tmp_path / "nowhere"),
                 "--workers", "1", "--steps", "2", "--dry-run"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("env", [{"RANK": "{r}", "WORLD_SIZE": "2"},
                                 {"SLURM_PROCID": "{r}", "SLURM_STEP_ID": "0",
                                  "SLURM_NTASKS": "2"}])
def test_a_job_says_its_missing_data_folder_once(tmp_path, capsys, monkeypatch, env):
    """Every rank of a torchrun or srun world checks the same input: rank 0 says what is
    wrong, the others exit 2 without repeating it."""
    from parascale.cli.main import main

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    argv = ["train", "--dataset", "cifar10", "--data-dir", str(tmp_path / "nowhere"),
            "--steps", "2"]
    said = {}
    for rank in (0, 1):
        for name, value in env.items():
            monkeypatch.setenv(name, value.format(r=rank))
        assert main(argv) == 2
        said[rank] = capsys.readouterr().err.strip().splitlines()
    assert len(said[0]) == 1 and "--data-dir" in said[0][0] and "does not exist" in said[0][0]
    assert said[1] == []


def test_a_misspelt_model_is_said_before_the_cluster_is_asked(monkeypatch, capsys, tmp_path):
    """sinfo waits seconds for a controller that does not answer; a usage error must not."""
    from conftest import one_line_error
    from parascale.cli.main import main

    asked = []
    monkeypatch.setattr(scheduler, "cpus_per_node", lambda partition: asked.append(partition))
    assert main(["slurm", "bench", "--model", "nosuch", "--dry-run",
                 "--out", str(tmp_path / "s")]) == 2
    assert "unknown model 'nosuch'" in one_line_error(capsys)
    assert asked == []
