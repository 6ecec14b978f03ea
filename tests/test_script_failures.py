"""A script under ``parascale run`` that fails: the job ends naming the rank and the script's
own error and line, whichever way it fails (raises, exits non-zero, never calls the API, hangs
in a collective)."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from helpers import STUCK_SLACK_S, cli
from parascale.cli.main import main

pytestmark = pytest.mark.slow  # every test here starts workers

def write_script(tmp_path: Path) -> Path:
    script = tmp_path / "failing.py"
    script.write_text('''\
import os
import sys
import threading

import torch
from torch.utils.data import DataLoader, TensorDataset

import parascale.script as ps

mode = sys.argv[1]
if mode == "no-api":
    sys.exit(0)
run = ps.start()
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = run.shard(DataLoader(data, batch_size=8))
model = torch.nn.Linear(4, 1)
model, optimizer = run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
if run.rank == 1 and mode == "raise":
    raise ValueError("a batch of the wrong shape")  # line 19
if run.rank == 1 and mode == "exit":
    sys.exit(3)  # line 21
if run.rank == 1 and mode == "hang":
    threading.Event().wait()  # rank 1 never takes part in the first step's all-reduce
if run.is_main:
    print("stepping", flush=True)
for step, (x, y) in enumerate(loader):
    if run.rank == 1 and step == 2 and mode == "exit0":
        sys.exit(0)  # line 28: rank 1 leaves mid-loop, the others go on
    if run.rank == 1 and step == 2 and mode == "os-exit0":
        os._exit(0)
    optimizer.zero_grad()
    run.backward(((model(x) - y) ** 2).mean())
    optimizer.step()
if mode == "ok":  # a checkpoint written by rank 0 and read back by every rank
    run.save(sys.argv[2], model=model, optimizer=optimizer, step=8)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert run.load(sys.argv[2], model=model, optimizer=optimizer)["step"] == 8
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
''')
    return script


@pytest.mark.parametrize("mode, said", [
    ("raise", "rank 1 failed: ValueError: a batch of the wrong shape (failing.py:19)"),
    ("exit", "rank 1 failed: failing.py exited with status 3 (failing.py:21)"),
    ("no-api", "failing.py never called parascale.script.start()"),
])
def test_a_failing_script_ends_the_job_naming_the_rank_and_its_own_line(tmp_path, capfd,
                                                                       mode, said):
    out = tmp_path / "run"
    code = main(["run", "--workers", "2", "--timeout", "30", "--out", str(out),
                 str(write_script(tmp_path)), mode])
    err = capfd.readouterr().err
    assert code == 1
    assert said in err
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "failed" and said in record["reason"]


@pytest.mark.parametrize("mode, said", [
    ("exit0", "rank 1 exited with status 0 before the run finished (failing.py:28)"),
    ("os-exit0", "rank 1 exited with status 0 before the run finished; rank 0 then failed:"),
])
def test_a_copy_that_exits_with_status_0_mid_loop_is_named(tmp_path, capfd, mode, said):
    """Not rank 0, whose collective broke when rank 1 left. sys.exit(0) goes on to the run's
    closing collective, which waits for the others until --timeout; os._exit(0) leaves at once."""
    out = tmp_path / "run"
    code = main(["run", "--workers", "2", "--timeout", "5", "--out", str(out),
                 str(write_script(tmp_path)), mode])
    err = capfd.readouterr().err
    assert code == 1
    assert said in err, err
    assert said in json.loads((out / "record.json").read_text())["reason"]


def test_a_script_hung_in_a_collective_ends_within_the_timeout_naming_the_rank(tmp_path):
    timeout = 5.0
    proc = cli("run", "--workers", "2", "--timeout", str(timeout), "--out", str(tmp_path / "run"),
               str(write_script(tmp_path)), "hang", tmpdir=tmp_path / "tmp",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert "stepping" in (line.strip() for line in iter(proc.stdout.readline, "")), \
        "rank 0 never began its steps"
    hung = time.monotonic()  # rank 0 is about to step, rank 1 waits already: no later
    _, stderr = proc.communicate(timeout=120)
    ended = time.monotonic() - hung
    assert proc.returncode == 1
    assert "rank 1 stopped responding" in stderr
    assert ended <= timeout + STUCK_SLACK_S + 3.0, f"the job ended {ended:.1f} s after the hang"
