"""parascale slurm across two nodes that are really apart: a Slurm cluster of its own on
network namespaces (.ci/nodes.py), slurmctld on a third node, one slurmd per node found by its
own host name; a 2-node job and a 2-node study, reported unchanged."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

STUDY = ["--workers", "2,4", "--nodes", "2", "--scaling", "weak", "--batch-size", "16",
         "--steps", "5", "--timeout", "60", "--time", "5"]


@pytest.fixture
def cluster(multinode, tmp_path):
    """(nodes, env): node0 and node1 compute, node2 the controller."""
    why = None
    if shutil.which("slurmd") is None or shutil.which("slurmctld") is None:
        why = "slurmd/slurmctld are not installed (.ci/slurm-up.sh installs them, as root)"
    elif subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode:
        why = "munged is not running (.ci/slurm-up.sh starts it)"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must test Slurm across nodes: {why}")
        pytest.skip(why)
    nodes = multinode(3)
    env = {**os.environ, **nodes.slurm(tmp_path / "slurm")}
    env.pop("PARASCALE_FAULT", None)

    def both_idle():
        done = nodes.run(0, ["sinfo", "-h", "-o", "%t %D"], env=env, capture_output=True,
                         text=True)
        return done.stdout.split() == ["idle", "2"]

    assert wait_until(both_idle, timeout_s=120), \
        [p.read_text()[-2000:] for p in (tmp_path / "slurm").glob("*.log")]
    return nodes, env


def parascale(cluster, *args: str) -> subprocess.CompletedProcess:
    """The CLI inside node0, as a user on a cluster's login node."""
    nodes, env = cluster
    try:
        done = nodes.run(0, [sys.executable, "-m", "parascale", *args], env=env,
                         capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as stuck:
        # say where it stood: the queue and each daemon's last lines, not a bare timeout
        queue = nodes.run(0, ["squeue", "-a", "-o", "%i %T %R %N"], env=env,
                          capture_output=True, text=True, timeout=30).stdout
        logs = {p.name: p.read_text()[-1500:] for p in Path(env["SLURM_CONF"]).parent.glob("*.log")}
        pytest.fail(f"parascale {' '.join(args)} still running after {stuck.timeout} s\n"
                    f"{stuck.stdout}{stuck.stderr}\nqueue:\n{queue}\nlogs: {logs}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def record(path: Path) -> dict:
    return json.loads((path / "record.json").read_text())


@pytest.mark.timeout(900)  # two slurm calls of at most 240 s each, and the report
def test_a_two_node_job_and_study_run_across_the_nodes(cluster, tmp_path):
    out = tmp_path / "run"
    done = parascale(cluster, "slurm", "train", "--workers", "2", "--nodes", "2",
                     "--global-batch", "32", "--steps", "5", "--timeout", "60", "--time", "5",
                     "--out", str(out), "--submit", "--wait")
    assert "COMPLETED" in done.stdout
    run = record(out)
    assert run["status"] == "ok" and run["environment"]["launcher"] == "slurm"
    assert run["derived"]["world_size"] == 2
    assert sorted(run["environment"]["hosts"]) == ["node0", "node1"]  # one task on each

    study = tmp_path / "study"
    done = parascale(cluster, "slurm", "bench", *STUDY, "--out", str(study), "--submit",
                     "--wait")
    assert "2 job(s) submitted" in done.stdout and "report:" in done.stdout
    plan = json.loads((study / "plan.json").read_text())
    for entry in plan["runs"]:
        run = record(study / "runs" / entry["folder"])
        assert run["status"] == "ok" and run["derived"]["world_size"] == entry["workers"]
        assert sorted(set(run["environment"]["hosts"])) == ["node0", "node1"]
    report = parascale(cluster, "report", str(study))
    assert report.returncode == 0
