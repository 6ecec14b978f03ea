"""Workers fork from a fork server that imported torch once (parascale.runtime.processes), yet
each starts as a fresh interpreter would: one thread, its own unseeded random stream, the
launcher's environment, working folder and output of the moment; and a configuration trains
the same whether it runs first or after others in the same process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
import torch

from conftest import wait_until
from parascale import train
from parascale.runtime import launch

PROBE = """
import json, os, sys, threading
threads = len(os.listdir("/proc/self/task"))
preloaded = "torch" in sys.modules
import torch
print("probe rank", os.environ["PARASCALE_RANK"], "speaks", flush=True)
out = os.path.join(os.environ["PROBE_OUT"], f"rank{os.environ['PARASCALE_RANK']}.json")
with open(out, "w") as f:
    json.dump({"threads": threads, "python_threads": threading.active_count(),
               "torch_threads": torch.get_num_threads(), "rand": torch.rand(3).tolist(),
               "cwd": os.getcwd(), "marker": os.environ.get("PROBE_MARKER"),
               "parent": os.getppid(), "preloaded": preloaded}, f)
"""

# forked from the fork server, as an HPO trial is: forks its own server, then starts a probe
OWN_SERVER = """
import json, os
from parascale.runtime import mp_private, processes

forked = processes.fork_own_server()
server = mp_private.forkserver_pid()
os.environ["PROBE_MARKER"] = "set after the fork"
probe = processes.start_module("startup_probe", {**os.environ, "PARASCALE_RANK": "0"}, None, 1,
                               "probe")
seen = {"forked": forked, "server": server, "code": probe.wait(120),
        "server_parent": int(open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()[1]),
        "same_program": open(f"/proc/{server}/cmdline").read() == open("/proc/self/cmdline").read()}
with open(os.path.join(os.environ["PROBE_OUT"], "trial.json"), "w") as f:
    json.dump(seen, f)
"""


def _probe(tmp_path, run: int) -> list[dict]:
    out = tmp_path / f"out{run}"
    out.mkdir()
    outcome = launch("startup_probe", 2, {"PYTHONPATH": str(tmp_path), "PROBE_OUT": str(out)},
                     threads=1)
    assert outcome.status == "ok", outcome
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_a_worker_starts_as_a_fresh_interpreter_would(tmp_path, monkeypatch, capfd):
    (tmp_path / "startup_probe.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PROBE_MARKER", "first")
    first = _probe(tmp_path, 0)
    train({"model": "mlp", "dataset": "digits", "image_size": 28, "workers": 2, "steps": 2})
    monkeypatch.setenv("PROBE_MARKER", "second")  # set after the fork server started
    second = _probe(tmp_path, 1)
    for seen, marker in ((first, "first"), (second, "second")):
        for rank in seen:
            assert rank["threads"] == 1 and rank["python_threads"] == 1
            assert rank["torch_threads"] == 1
            assert rank["cwd"] == str(tmp_path) and rank["marker"] == marker
    # torch seeds its default generator from entropy at import, so fresh interpreters draw
    # different streams; forks of one server must not all draw the server's
    draws = [tuple(rank["rand"]) for rank in first + second]
    assert len(set(draws)) == len(draws), draws
    assert "probe rank 0 speaks" in capfd.readouterr().out  # rank 0 on this test's output


@pytest.mark.slow
def test_without_multiprocessings_private_parts_workers_start_as_fresh_interpreters(
        tmp_path, monkeypatch, capfd):
    """A Python whose multiprocessing lacks a private name the fork server relies on: each
    worker is then a fresh interpreter, child of the launcher, and starts as a fork would."""
    from multiprocessing import forkserver

    from parascale.runtime import mp_private

    (tmp_path / "startup_probe.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PROBE_MARKER", "plain")
    monkeypatch.delattr(forkserver._forkserver, "_forkserver_alive_fd")
    assert mp_private.missing() == ["multiprocessing.forkserver._forkserver._forkserver_alive_fd"]
    seen = _probe(tmp_path, 0)
    for rank in seen:
        assert rank["parent"] == os.getpid()  # not a fork of the fork server
        assert rank["threads"] == 1 and rank["python_threads"] == 1
        assert rank["torch_threads"] == 1
        assert rank["cwd"] == str(tmp_path) and rank["marker"] == "plain"
    assert seen[0]["rand"] != seen[1]["rand"]
    assert "probe rank 0 speaks" in capfd.readouterr().out


@pytest.mark.slow
def test_a_process_forked_from_the_server_forks_its_own_for_what_it_starts(tmp_path,
                                                                          monkeypatch):
    """An HPO trial starts its workers: from a fork server it forked from itself, holding what
    the first server imported (no interpreter imports torch again), and they start as a fresh
    interpreter would; the trial's server goes with it. A process not forked from the fork
    server (this one) makes none."""
    from parascale.runtime import processes

    (tmp_path / "startup_probe.py").write_text(PROBE)
    (tmp_path / "own_server.py").write_text(OWN_SERVER)
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PROBE_OUT": str(tmp_path)}
    trial = processes.start_module("own_server", env, tmp_path / "trial.log", 1, "trial")
    assert trial.wait(120) == 0, (tmp_path / "trial.log").read_text()
    seen = json.loads((tmp_path / "trial.json").read_text())
    probe = json.loads((tmp_path / "rank0.json").read_text())
    assert seen["forked"] and seen["code"] == 0
    assert seen["server_parent"] == trial.pid and seen["same_program"]  # a fork, not an exec
    assert probe["parent"] == seen["server"] and probe["preloaded"]
    assert probe["threads"] == 1 and probe["python_threads"] == 1 and probe["torch_threads"] == 1
    assert probe["cwd"] == str(tmp_path) and probe["marker"] == "set after the fork"
    assert wait_until(lambda: not psutil.pid_exists(seen["server"]), 30)
    assert processes.fork_own_server() is False


def _params(out) -> dict:
    state = torch.load(out / "model.pt", map_location="cpu")
    return state.get("model", state) if isinstance(state, dict) else state


@pytest.mark.slow
def test_a_configuration_trains_the_same_first_or_after_others(tmp_path):
    config = {"model": "mlp", "dataset": "digits", "image_size": 28, "workers": 2,
              "steps": 3, "seed": 3}
    first = train({**config, "out": str(tmp_path / "first")})
    train({**config, "model": "lenet", "seed": 9, "steps": 2})  # another, in between
    again = train({**config, "out": str(tmp_path / "again")})
    assert first["status"] == again["status"] == "ok"
    assert [e["train_loss"] for e in first["epochs"]] == [e["train_loss"] for e in again["epochs"]]
    a, b = _params(tmp_path / "first"), _params(tmp_path / "again")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_workers_train_on_the_launchers_data_without_building_it(tmp_path, monkeypatch):
    """A scikit-learn that cannot be imported, seen only by the workers: they take the digits
    the launcher built (parascale.data.handover) and train as a worker that built them would."""
    broken = tmp_path / "broken"
    (broken / "sklearn").mkdir(parents=True)
    (broken / "sklearn" / "__init__.py").write_text("raise ImportError('no scikit-learn here')\n")
    config = {"model": "mlp", "dataset": "digits", "image_size": 12, "workers": 2, "steps": 2,
              "seed": 5}
    built = train({**config, "out": str(tmp_path / "built")})
    monkeypatch.setenv("PYTHONPATH", str(broken))
    handed = train({**config, "out": str(tmp_path / "handed")})
    assert built["status"] == handed["status"] == "ok", handed.get("error")
    a, b = _params(tmp_path / "built"), _params(tmp_path / "handed")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_no_process_of_a_killed_launcher_survives_it(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-m", "parascale", "train", "--workers", "2",
                                 "--epochs", "500", "--no-save-model", "--out",
                                 str(tmp_path / "run")],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in launcher.stdout:  # the workers are training
        if line.startswith("epoch") or "joined" in line:
            break
    family = psutil.Process(launcher.pid).children(recursive=True)
    assert len(family) >= 4, family  # fork server, resource tracker, two workers
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    # they notice at once; 60 s is a bound for a loaded machine, not an expectation
    _, alive = psutil.wait_procs(family, timeout=60)
    assert alive == []
