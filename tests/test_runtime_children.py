"""Every process a worker started is gone when the launcher returns, and SIGTERM to the launcher
reaches them together with the workers: a script's ``subprocess.Popen`` and ``multiprocessing``
children neither outlive ``parascale run`` nor wait out the grace period before a SIGKILL."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from helpers import alive, cli
from parascale.cli.main import main

pytestmark = pytest.mark.slow  # every test here starts workers

# a child that says whether SIGTERM reached it
CHILD = '''\
import pathlib, signal, sys, time
path = pathlib.Path(sys.argv[1])
def said(signum, frame):
    path.write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, said)
path.write_text("started")
while True:
    time.sleep(60)
'''


def write_script(tmp_path: Path) -> Path:
    (tmp_path / "child.py").write_text(CHILD)
    script = tmp_path / "parent.py"
    script.write_text('''\
import multiprocessing, subprocess, sys, time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import parascale.script as ps

folder, mode = Path(sys.argv[1]), sys.argv[2]
run = ps.start()
said = folder / f"popen{run.rank}"
child = subprocess.Popen([sys.executable, str(folder / "child.py"), str(said)])
helper = multiprocessing.Process(target=time.sleep, args=(600,), daemon=True)
helper.start()
(folder / f"pids{run.rank}").write_text(f"{child.pid} {helper.pid}")
while not said.exists():  # its SIGTERM handler is in place
    time.sleep(0.01)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = run.shard(DataLoader(data, batch_size=8))
model = torch.nn.Linear(4, 1)
model, optimizer = run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
for epoch in range(1 if mode == "once" else 10**9):
    for x, y in loader:
        optimizer.zero_grad()
        run.backward(((model(x) - y) ** 2).mean())
        optimizer.step()
    if epoch == 0 and run.is_main:
        print("stepping", flush=True)  # both ranks are past their children's start
''')
    return script


def children(tmp_path: Path) -> list[int]:
    return [int(pid) for rank in (0, 1) for pid in (tmp_path / f"pids{rank}").read_text().split()]


def test_a_scripts_children_are_gone_when_parascale_run_returns(tmp_path, capfd):
    code = main(["run", "--workers", "2", "--timeout", "30", "--out", str(tmp_path / "run"),
                 str(write_script(tmp_path)), str(tmp_path), "once"])
    assert code == 0, capfd.readouterr().err
    pids = children(tmp_path)
    assert len(pids) == 4
    assert alive(pids) == []


def test_sigterm_reaches_a_scripts_children_with_the_workers(tmp_path):
    """The children get SIGTERM as the workers do, not a SIGKILL once a grace period for them
    ran out (which made a SIGTERMed launcher take 8 s to exit)."""
    proc = cli("run", "--workers", "2", "--timeout", "30", "--out", str(tmp_path / "run"),
               str(write_script(tmp_path)), str(tmp_path), "forever", tmpdir=tmp_path / "tmp",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert "stepping" in (line.strip() for line in iter(proc.stdout.readline, "")), \
        "the copies never stepped"
    pids = children(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert [(tmp_path / f"popen{rank}").read_text() for rank in (0, 1)] == ["SIGTERM"] * 2
    assert alive(pids) == []
