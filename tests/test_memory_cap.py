"""--device-memory: each CPU worker in a memory cgroup of its own, capped for real.

The process tests use this machine's cgroups (v1 or v2, whichever this process may write); they
skip, saying why, where there is none, and fail instead under CI (CI=true), which runs as root
on machines that have them.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import one_line_error, run_training, usable_hierarchy, wait_until
from helpers import alive, began, cli, tree
from parascale.bench.runner import run_study
from parascale.bench.study import combine, make_jobs
from parascale.cli.main import main
from parascale.runtime import cgroups, memory_cap

CAP = "400MiB"  # the floor: an mlp on digits needs about 30 MiB of its own per worker
MIB = 1 << 20


def groups_of(pid: int) -> list[Path]:
    """The job cgroups that launcher ``pid`` made and has not removed."""
    return sorted(usable_hierarchy().base.glob(f"{cgroups.PREFIX}{pid}.*"))


# --- sizes and bad input: nothing starts -----------------------------------------------------

def test_sizes_are_binary_and_in_ascii_digits():
    assert memory_cap.read_size("3GiB") == memory_cap.read_size("3G") == \
        memory_cap.read_size("3gb") == 3 << 30
    assert memory_cap.read_size("512MiB") == 512 * MIB
    assert memory_cap.read_size("2.5G") == int(2.5 * (1 << 30))
    assert memory_cap.read_size("1000") == memory_cap.read_size("1000B") == 1000
    for bad in ("lots", "3X", "-1G", "0", "\uff13G", "1e3G", "", "G", "1.G", None):
        assert memory_cap.read_size(bad) is None, bad
    assert memory_cap.size_text(3 << 30) == "3 GiB"
    assert memory_cap.size_text(400 * MIB) == "400 MiB"


@pytest.mark.parametrize("args, words", [
    (["--device-memory", "3X"], "--device-memory expects a size such as 3GiB"),
    (["--device-memory", "100MiB"], "below the 400 MiB a worker needs for the interpreter and "
                                    "torch alone"),
    (["--device-memory", "1000TiB"], "is more than the"),
    (["--device-memory", "1GiB", "--gpus", "0"], "on a GPU the device's memory is the limit"),
    (["--device-memory", "1GiB", "--sync", "parameter-server"],
     "helper process(es) are rank 0's children"),
])
def test_a_cap_that_cannot_hold_is_refused_in_one_line_before_anything_runs(
        tmp_path, capsys, args, words):
    out = tmp_path / "run"
    assert main(["train", "--model", "mlp", "--steps", "1", "--out", str(out), *args]) == 2
    assert words in one_line_error(capsys)
    assert not out.exists()


def test_run_takes_the_cap_and_slurm_refuses_it(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    assert main(["run", "--device-memory", "10MiB", str(script)]) == 2
    assert "--device-memory 10MiB is below the 400 MiB" in one_line_error(capsys)
    assert main(["slurm", "train", "--model", "mlp", "--device-memory", "1GiB",
                 "--dry-run"]) == 2
    assert "Slurm's own memory limit" in one_line_error(capsys)


def test_no_memory_controller_is_said_with_what_would_allow_one():
    with pytest.raises(cgroups.Unavailable, match="no memory cgroup controller"):
        cgroups.find("1:cpu:/\n0::/\n", "30 1 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup "
                                        "rw,cpu\n")


def test_cgroup_v2_caps_memory_with_no_swap_where_the_parent_hands_the_controller_down(
        tmp_path):
    """The v2 files, on a folder laid out as cgroup2 lays out a parent that hands the memory
    controller down (this machine's memory controller is v1's, so not on cgroup2 itself)."""
    parent = tmp_path / "user.slice"
    own = parent / "session.scope"
    own.mkdir(parents=True)
    (parent / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("\n")  # it holds this process: cannot
    for folder in (parent, own):
        (folder / "cgroup.procs").write_text("")
    where = cgroups.find("0::/user.slice/session.scope\n",
                         f"35 24 0:30 / {tmp_path} rw - cgroup2 cgroup2 rw\n")
    assert where == cgroups.Hierarchy(2, parent, tmp_path)
    (rank0,) = cgroups.make_job(where, "parascale-mem-1.2-ab", 1, 400 * MIB)
    assert (rank0.parent / "cgroup.subtree_control").read_text() == "+memory"
    assert (rank0 / "memory.max").read_text() == str(400 * MIB)


def test_a_study_sweeps_the_cap_as_its_own_configurations():
    jobs = make_jobs(combine(options={"model": "mlp", "steps": 1, "batch_size": 16},
                             variables=[("device_memory", ["400MiB", "1GiB"])], workers="1"))
    assert [j.train["device_memory"] for j in jobs] == ["400MiB", "1GiB"]
    assert jobs[0].memory_key != jobs[1].memory_key  # an oom at one cap says nothing of another


def test_a_study_does_not_search_the_largest_batch_under_a_cap(tmp_path, capsys):
    usable_hierarchy()  # the cap passes every other check first
    assert main(["bench", "--model", "mlp", "--steps", "1", "--workers", "1", "--batch-size",
                 "max", "--device-memory", "1GiB", "--out", str(tmp_path / "s")]) == 2
    assert "batch_size max searches against the resident memory" in one_line_error(capsys)
    assert not (tmp_path / "s").exists()


# --- real cgroups -------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_workers_that_fit_train_under_the_cap_and_record_its_peaks(tmp_path):
    usable_hierarchy()
    record, _ = run_training(tmp_path / "fit", workers=2, model="mlp", steps=4,
                             device_memory=CAP, save_model=False)
    assert record["config"]["device_memory"] == CAP
    peaks = record["memory"]["cgroup_peak_bytes_per_rank"]
    assert len(peaks) == 2 and all(0 < p < 400 * MIB for p in peaks), peaks
    assert groups_of(os.getpid()) == []


@pytest.mark.slow
def test_a_worker_over_its_cap_ends_the_run_as_oom_in_one_line(tmp_path):
    usable_hierarchy()
    out = tmp_path / "run"
    proc = cli("train", "--workers", "2", "--model", "mlp", "--steps", "6", "--timeout", "60",
               "--no-save-model", "--device-memory", CAP, "--out", str(out),
               tmpdir=tmp_path / "tmp", fault="hog@1:3", stdout=subprocess.PIPE,
               stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stdout + stderr
    assert stderr.strip().splitlines() == [
        "parascale: failed: rank 1: ran out of memory: its --device-memory cap is 400 MiB (the "
        f"kernel's out-of-memory killer ended it there) (record: {out}/record.json)"], stderr
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "oom"
    assert record["reason"].startswith("rank 1: ran out of memory: its --device-memory cap")
    assert groups_of(proc.pid) == []


@pytest.mark.slow
def test_parascale_run_from_python_caps_its_copies_too(tmp_path):
    """The cap travels with the launch (the job's configuration), not around the command: a
    script's copies started by ``parascale.script.launch.run`` are capped as the CLI's are."""
    from parascale.script.launch import run

    usable_hierarchy()
    script = tmp_path / "hog.py"
    script.write_text("hog = b'\\x01' * (600 << 20)  # every page written: 600 MiB\n")
    record = run({"workers": 1, "device_memory": CAP, "timeout": 60.0,
                  "out": str(tmp_path / "run")}, script, [])
    assert record["status"] == "oom", record["reason"]
    assert record["reason"] == ("rank 0: ran out of memory: its --device-memory cap is 400 MiB "
                                "(the kernel's out-of-memory killer ended it there)")
    assert groups_of(os.getpid()) == []


@pytest.mark.slow
def test_a_study_skips_a_larger_batch_after_one_ran_out_of_its_cap(tmp_path):
    """smallcnn on 3x32x32 inputs: about 230 MiB of its own at batch 16, over 500 at 512."""
    usable_hierarchy()
    options = {"model": "smallcnn", "dataset": "synthetic", "synthetic_size": 1024, "steps": 2,
               "timeout": 60.0, "noise_scale": False, "device_memory": CAP}
    jobs = make_jobs(combine(options=options, variables=[("batch_size", [1024, 16, 512])],
                             scaling="weak", workers="1"))
    result = run_study(tmp_path / "study", jobs)
    by_batch = {r["config"]["batch_size"]: r for r in result.values()}
    assert by_batch[16]["status"] == "ok", by_batch[16]["reason"]
    assert by_batch[512]["status"] == "oom", by_batch[512]["reason"]
    assert "its --device-memory cap is 400 MiB" in by_batch[512]["reason"]
    assert by_batch[1024]["status"] == "skipped"
    assert by_batch[1024]["reason"].startswith("not run: per-device batch 1024 is larger than "
                                               "512, which ran out of memory")
    assert groups_of(os.getpid()) == []


def _started(tmp_path: Path, name: str) -> subprocess.Popen:
    """A capped 2-worker job that trains until stopped, once both workers are in their
    cgroups."""
    proc = cli("train", "--workers", "2", "--model", "mlp", "--steps", "100000",
               "--device-memory", CAP, "--no-save-model", "--out", str(tmp_path / name),
               tmpdir=tmp_path / "tmp", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert began(proc), proc.stderr.read()
    workers = sorted(p.pid for p in tree(proc.pid) if p.name().startswith("parascale-r"))
    (job,) = groups_of(proc.pid)
    held = sorted(int(pid) for group in sorted(job.glob("rank*"))
                  for pid in (group / "cgroup.procs").read_text().split())
    assert held == workers  # each worker in a cgroup of its own, nothing else in them
    return proc


@pytest.mark.slow
def test_no_cgroup_outlives_a_sigterm_and_a_killed_launchers_go_with_the_next_launch(tmp_path):
    usable_hierarchy()
    proc = _started(tmp_path, "term")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert groups_of(proc.pid) == []

    proc = _started(tmp_path, "kill")
    pids = [p.pid for p in tree(proc.pid)]
    proc.kill()
    proc.wait()
    assert wait_until(lambda: not alive(pids), 30.0), alive(pids)
    (job,) = groups_of(proc.pid)  # nothing could remove it
    # a killed process leaves its cgroup a moment after it is dead (later on a loaded machine);
    # a sweep takes only groups whose processes have left, and leaves the others to the next
    assert wait_until(lambda: not any((group / "cgroup.procs").read_text().split()
                                      for group in job.glob("rank*")), 30.0)
    run_training(tmp_path / "next", workers=1, model="mlp", steps=1, device_memory=CAP,
                 save_model=False)
    assert groups_of(proc.pid) == []


def _in_namespace(setup: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``parascale train --device-memory`` where ``setup`` changed this machine's cgroup mounts,
    in a mount namespace of its own (root only)."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root, which these tests need (a mount namespace)")
        pytest.skip("a mount namespace needs root")
    command = f"{setup} && exec {sys.executable} -m parascale train --model mlp --steps 1 " \
              f"--device-memory 1GiB --out {tmp_path / 'run'}"
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           command], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("setup, words", [
    ("mount -o remount,bind,ro {mount}", "is mounted read-only"),
    ("umount -l {mount}", "no memory cgroup controller is available"),
])
def test_cgroups_that_cannot_be_made_are_refused_in_one_line(tmp_path, setup, words):
    """A read-only cgroup file system (as in most containers), or none with the memory
    controller: the same machine, seen from a mount namespace where it is so."""
    done = _in_namespace(setup.format(mount=usable_hierarchy().mount), tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert words in line and line.endswith("or leave out --device-memory")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_user_who_may_not_create_cgroups_is_told_so(tmp_path):
    """In a child that gives up root (cgroups.find is imported already: it reads no more
    code), where root could."""
    usable_hierarchy()
    if os.geteuid() != 0:
        pytest.skip("this user may create cgroups (delegated): no user here to refuse")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.setgid(65534)
        os.setuid(65534)
        try:
            cgroups.find()
            said = "found"
        except cgroups.Unavailable as exc:
            said = str(exc)
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    assert said.startswith("this user may not create cgroups in "), said
