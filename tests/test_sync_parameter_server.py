"""The parameter server beyond equivalence: async training, staleness, and failures.

Server processes are found through /proc by their module name and a tag in their environment
that only this test's processes carry, so a test never touches anyone else's processes.
"""
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import wait_until

pytestmark = pytest.mark.slow  # every test here starts worker processes

SERVER_MODULE = b"parascale.sync.ps_server"


def servers_tagged(tag: str) -> list[int]:
    """Live parameter-server processes whose environment carries PARASCALE_TEST_TAG=tag."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if SERVER_MODULE not in (entry / "cmdline").read_bytes():
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if f"PARASCALE_TEST_TAG={tag}".encode() in environ:
            found.append(int(entry.name))
    return found


@pytest.fixture
def tag(monkeypatch):
    value = uuid.uuid4().hex
    monkeypatch.setenv("PARASCALE_TEST_TAG", value)
    return value


def test_async_server_trains_digits_and_a_slowed_worker_sends_stale_gradients(train_run,
                                                                               monkeypatch):
    # rank 1 sleeps 20 ms before every step, so rank 0 updates the model while rank 1 computes
    monkeypatch.setenv("PARASCALE_FAULT", "slow@1:0.02")
    record, _ = train_run(workers=2, batch_size=32, epochs=3, model="mlp",
                          sync="parameter-server", ps_mode="async")
    assert record["summary"]["final_test_accuracy"] >= 0.90  # 95% measured; 1/10 is chance
    sync = record["sync"]
    assert sync["ps_mode"] == "async"
    steps = record["derived"]["total_steps"]
    assert sync["staleness"]["count"] == 2 * steps  # one per push (2 workers, 1 shard)
    assert sync["staleness"]["max"] > 0
    fast, slow = sync["staleness_per_rank"]
    assert slow["mean"] > fast["mean"], sync


@pytest.mark.parametrize("rank", [1, 0])  # rank 0 is the servers' parent
def test_no_server_outlives_a_killed_worker(train_run, monkeypatch, tag, rank):
    monkeypatch.setenv("PARASCALE_FAULT", f"kill@{rank}:3")
    # timeout bounds the servers' start too: 10 s was too short for it on a loaded machine;
    # the death is seen at once, whatever the timeout
    record, _ = train_run(expect="failed", workers=2, global_batch=32, epochs=2, timeout=60.0,
                          sync="parameter-server", ps_servers=2)
    assert f"rank {rank}" in record["reason"] and "SIGKILL" in record["reason"]
    # the servers end when their parent does; a generous bound for a loaded machine
    assert wait_until(lambda: not servers_tagged(tag), 60.0), servers_tagged(tag)


def test_a_killed_server_fails_the_job_naming_it(tmp_path, tag):
    env = {**os.environ, "PARASCALE_FAULT": "slow@0:0.05,slow@1:0.05"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "parascale", "train", "--workers", "2", "--model", "mlp",
         "--steps", "400", "--timeout", "20", "--sync", "parameter-server",
         "--out", str(tmp_path / "run")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        servers = wait_until(lambda: servers_tagged(tag), 60.0)
        assert servers, "no parameter server started"
        # training under way: rank 0's first epoch line is in the run's log (the launcher
        # writes it in its staging folder beside --out until the run ends)
        assert wait_until(lambda: any("epoch 1/" in log.read_text()
                                      for log in tmp_path.glob("*/log.txt")), 120.0), \
            "no epoch finished"
        os.kill(servers[0], signal.SIGKILL)
        # the last line names the killed server: found by its death, not by the 20 s timeout
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"parascale: failed: rank 0 failed: RuntimeError: parameter server 0 "
                           f"(pid {servers[0]}) was killed by SIGKILL"), stderr
