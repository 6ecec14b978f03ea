"""Shared helpers: real training runs through the public API, read back from their files; what
the equivalence and process tests share; run records written with stated figures for the
report's tests; and the guard that keeps the fast tier (``-m "not slow"``) free of processes.

Test modules import helpers from here, never from each other."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

# Tests time nothing, and on a machine shared with other jobs torch's pool of one thread a core
# spins against them: test_models.py took 60 s with 2 threads under load, 11 s with 1. Workers
# are other processes and get their threads from the launcher, not from here.
torch.set_num_threads(1)

# ---- the GPU tier -----------------------------------------------------------------------------
# tests/test_gpu_*.py: what only a CUDA device can show (``make test-gpu`` runs them; without a
# GPU they are skipped, saying why). They start workers or probes, so they are slow too.
GPU_TIER = [pytest.mark.gpu, pytest.mark.slow,
            pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a CUDA GPU: torch.cuda.is_available() is False here")]

# ---- the fast tier starts no process --------------------------------------------------------
# ``slow`` means "starts a process" (workers, servers, the CLI in a subprocess, a browser, git).
# A test without the marker that starts one fails, naming the marker, so `make test-fast` stays
# free of processes as tests are added. Python's audit events see every start through
# subprocess, os.fork/exec/spawn and os.system without touching production code; a child still
# alive after a test phase catches whatever starts processes some other way.

PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn",
                            "os.spawn", "os.exec", "os.system"})
_started: list[str] | None = None  # None while no fast test runs (audit hooks cannot be removed)


class ProcessInFastTest(RuntimeError):
    """Raised where a fast-tier test starts a process, so that it does not start."""


def _audit(event: str, args: tuple) -> None:
    if _started is not None and event in PROCESS_EVENTS:
        _started.append(f"{event} {str(args[:2])[:200]}")
        raise ProcessInFastTest(f"{event} in a test not marked slow (the fast tier starts none)")


sys.addaudithook(_audit)


def _children() -> dict[int, str]:
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            found[child.pid] = " ".join(child.cmdline())[:200]
        except psutil.Error:  # gone or a zombie: it was started all the same
            found[child.pid] = "(exited)"
    return found


def _stop_fork_server() -> None:
    """parascale's fork server is started by multiprocessing without an audit event and then
    lives for the session: a fast test that started it would hide every later one that would."""
    from parascale.runtime import mp_private

    mp_private.stop_forkserver()


@contextmanager
def _no_process(item: pytest.Item):
    """Fail ``item`` if it is not marked slow and starts a process during this phase."""
    global _started
    if item.get_closest_marker("slow") is not None:
        yield
        return
    before = _children()
    _started = []
    try:
        yield
    finally:
        started, _started = _started, None
        started += [f"child {pid}: {command}" for pid, command in _children().items()
                    if pid not in before]
        if started:  # replaces the test's own error, which the blocked start caused
            _stop_fork_server()  # so that the next test that would start it is caught too
            raise pytest.fail.Exception(
                f"{item.nodeid} starts a process but is not marked slow; add @pytest.mark.slow "
                f"(pytestmark = pytest.mark.slow for a whole file):\n  " + "\n  ".join(started),
                pytrace=False) from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _no_process(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _no_process(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    with _no_process(item):
        return (yield)


def run_training(out: Path, expect: str | None = "ok",
                 **options) -> tuple[dict, dict[str, torch.Tensor] | None]:
    """Run ``parascale.train`` into ``out``; return the record and the saved parameters.

    ``expect`` is the status the run must end with (its reason is shown when it does not).
    """
    import parascale

    options.setdefault("dataset", "digits")
    options.setdefault("model", "smallcnn")
    options.setdefault("timeout", 60.0)
    record = parascale.train({**options, "out": str(out)})
    if expect is not None:
        assert record["status"] == expect, record["reason"]
    on_disk = json.loads((out / "record.json").read_text())
    assert on_disk == record
    model = out / "model.pt"
    state = torch.load(model, map_location="cpu") if model.exists() else None
    return record, state


def usable_hierarchy():
    """The cgroups --device-memory makes its caps in, or a skip saying why there are none (a
    failure under CI, which runs as root on machines that have them)."""
    from parascale.runtime import cgroups

    try:
        return cgroups.find()
    except cgroups.Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the --device-memory tests: {exc}")
        pytest.skip(f"--device-memory: {exc}")


@pytest.fixture
def train_run(tmp_path):
    counter = iter(range(1000))

    def run(**options):
        return run_training(tmp_path / f"run{next(counter)}", **options)

    return run


# Equivalence runs: few steps with momentum and weight decay, so a wrong update shows; compared
# within 2e-5 absolute, 1e-4 relative (float sums in another order differ by about that)
STEPS = dict(steps=6, lr=0.1, momentum=0.9, weight_decay=1e-4, seed=3)


def assert_same(a: dict, b: dict, atol: float = 2e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-4, msg=name)


def one_line_error(capsys) -> str:
    """What a refused command printed: exactly one line on stderr, and no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def wait_until(condition, timeout_s: float):
    """``condition()``'s first true value within ``timeout_s``, else its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    return condition()


def run_chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with its own ``profile`` folder; skipped without it, except in CI."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI (apt-get install chromium)")
        pytest.skip("chromium not installed")
    command = [path, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               "--virtual-time-budget=5000", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


# ---- records in the documented schema (docs/record.md), with figures a test states ------------

def record(workers: int, throughput: float | None = None, *, epoch_time: float | None = None,
           model: str = "smallcnn", dataset: str = "digits", scaling: str | None = "weak",
           sync: str = "allreduce", status: str = "ok", reason: str | None = None,
           baseline: bool = False, repeat: int = 0, batch: int = 32, global_batch: int | None = None,
           step_p50: float | None = None, step_p95: float | None = None, accuracy: float = 0.9,
           tta: dict | None = None, epochs: int = 3, study: bool = True,
           epoch_throughputs: list[float] | None = None,
           machine: dict | None = None) -> dict[str, Any]:
    """A parascale.run/1 record. Give throughput or epoch_time; the other follows from 1,400 samples.

    ``epoch_throughputs`` states each steady epoch's throughput (a warm-up epoch is added before
    them; the summary's throughput stays ``throughput``); ``machine`` is the record's machine
    block (see :func:`machine_block`).
    """
    samples = 1400
    if throughput is None and epoch_time is None:  # unfinished runs carry no figures anyway
        throughput = 1.0
    if throughput is None:
        throughput = samples / epoch_time
    if epoch_time is None:
        epoch_time = samples / throughput
    global_batch = global_batch or batch * workers
    step = step_p50 if step_p50 is not None else global_batch / throughput
    epoch_list = [{
        "epoch": e, "warmup": e == 1, "wall_time_s": epoch_time * (1.5 if e == 1 else 1),
        "wall_time_s_per_rank": [epoch_time] * workers, "samples": samples,
        "throughput": throughput, "train_loss": 1.0 / e, "test_loss": 1.0 / e,
        "test_accuracy": accuracy * (0.7 + 0.3 * e / epochs), "elapsed_s": epoch_time * (e + 0.5),
        "lr": 0.05,
    } for e in range(1, epochs + 1)]
    if epoch_throughputs is not None:
        epoch_list = epoch_list[:1] + [
            {**epoch_list[0], "epoch": e, "warmup": False, "throughput": x,
             "wall_time_s": samples / x} for e, x in enumerate(epoch_throughputs, 2)]
    data: dict[str, Any] = {
        "schema": "parascale.run/1", "status": status, "reason": reason,
        "config": {"model": model, "dataset": dataset, "data_dir": None, "workers": workers,
                   "device": "cpu", "backend": "gloo", "batch_size": batch,
                   "global_batch": global_batch, "epochs": epochs, "lr": 0.05,
                   "precision": "fp32", "sync": sync, "target_accuracy": None},
        "derived": {"world_size": workers, "per_device_batch": global_batch // workers,
                    "global_batch": global_batch, "effective_lr": 0.05, "steps_per_epoch": 22,
                    "train_samples": samples, "test_samples": 360, "threads_per_worker": 1},
        "environment": {"python": "3.11.7", "torch": "2.14.1", "parascale": "0.1.0",
                        "backend": "gloo", "device_type": "cpu", "devices": ["cpu"] * workers,
                        "cpu_model": "Test CPU", "cpu_count": 8, "hosts": ["node1"],
                        "launcher": "local", "git_revision": None,
                        "start_time": "2026-11-22T09:30:00+00:00"},
        "epochs": epoch_list,
        "steps": {"count": 40 * workers, "excluded": "epoch 1 (warm-up)",
                  "phases": {"step": {"p50": step, "p95": step_p95 or step * 1.2,
                                      "max": step * 1.5, "mean": step * 1.05}},
                  "per_rank": [{"rank": r, "step_p50_s": step * (1 + 0.02 * r),
                                "step_p95_s": step * 1.2} for r in range(workers)]},
        "memory": {"kind": "cpu_max_rss", "peak_bytes_per_rank": [10**8] * workers},
        "time_to_accuracy": tta,
        "machine": machine,
        "summary": {"total_time_s": epoch_time * epochs * 1.2, "steady_epoch_time_s": epoch_time,
                    "steady_throughput": throughput, "final_test_accuracy": accuracy,
                    "final_test_loss": 0.3, "final_train_loss": 0.3},
        "study": {"name": "study", "config_id": re.sub(r"[^\w.-]", "_", model)
                  + f"-{scaling}-{sync}-n{workers}-r{repeat}{'-b' if baseline else ''}",
                  "scaling": scaling, "repeat": repeat, "baseline": baseline} if study else None,
    }
    if status != "ok":  # an unfinished run has no figures
        data.update(epochs=[], steps=None, summary=None)
    return data


def write_study(folder: Path, records: list[dict[str, Any]]) -> Path:
    """A bench-style study folder: runs/<config_id>/record.json."""
    for i, rec in enumerate(records):
        config_id = rec["study"]["config_id"] if rec.get("study") else f"run{i}"
        path = folder / "runs" / config_id / "record.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec))
    return folder


def machine_block(busy: bool = True, other: float = 0.95, cores: int = 2,
                  command: str = "python -m parascale train --workers 2",
                  pid: int = 4242) -> dict[str, Any]:
    """A record's ``machine`` block as runtime.machine writes it: ``other`` cores used by other
    programs during the run, the biggest of them ``command``."""
    return {"cores": cores, "window_s": 10.0, "other_cores": other, "steal_cores": 0.0,
            "busy": busy, "busy_threshold_cores": 0.25,
            "hosts": [{"host": "node1", "cores": cores, "busy_cores": other + 1.0,
                       "own_cores": 1.0, "other_cores": other, "steal_cores": 0.0,
                       "load_avg_1m": [1.0, 1.9],
                       "top_others": [{"pid": pid, "command": command, "cores": other * 0.9}]}],
            "method": "psutil.cpu_times and the run's own process times"}


# ---- several machines on one: nodes as network namespaces (.ci/nodes.py) ----------------------

def _nodes_tool():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / ".ci" / "nodes.py"
    spec = importlib.util.spec_from_file_location("parascale_ci_nodes", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def multinode():
    """``make(count, cap_mbit=0)`` -> a set of nodes (see .ci/nodes.py), removed with every
    process in it when the test ends, passed or failed. Skips, saying why, where namespaces
    cannot be made (not root, no ``ip``); fails instead under CI (CI=true), which runs as root
    so that these tests run."""
    tool = _nodes_tool()
    why = tool.unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the multi-node tests: {why}")
        pytest.skip(f"multi-node tests: {why}")
    made = []

    def make(count: int, cap_mbit: float = 0):
        made.append(tool.Nodes.up(count, cap_mbit))
        return made[-1]

    yield make
    for nodes in made:
        nodes.down()


# ---- a full disk, made real ------------------------------------------------------------------
def _mount_tmpfs(folder: Path, options: bytes, read_only: bool = False):
    """mount(2) a tmpfs at ``folder`` through libc, not mount(8): the fast tier starts no
    process. The unmount, or None where this process may not mount (not root, a container)."""
    import ctypes

    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # this process's own libc
    if libc.mount(b"tmpfs", str(folder).encode(), b"tmpfs", 1 if read_only else 0, options):
        return None  # MS_RDONLY is 1
    return lambda: libc.umount2(str(folder).encode(), 2)  # MNT_DETACH: even with a file open


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB file system (tmpfs) mounted at ``tmp_path/disk``, unmounted afterwards;
    skipped where this process may not mount (not root, or a container without the right)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    unmount = _mount_tmpfs(disk, b"size=4m")
    if unmount is None:
        pytest.skip("cannot mount a small tmpfs (a full disk) here: it needs root")
    yield disk
    unmount()


@pytest.fixture
def read_only_folder(tmp_path):
    """``make(folder)``: a folder this process cannot write, even as root (a read-only tmpfs
    then; a folder without write permission otherwise); undone afterwards."""
    undo = []

    def make(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        unmount = _mount_tmpfs(folder, b"size=1m", read_only=True)
        if unmount is None:
            if os.geteuid() == 0:
                pytest.skip("root writes any folder, and a read-only tmpfs cannot be mounted")
            folder.chmod(0o555)
            unmount = lambda: folder.chmod(0o755)  # noqa: E731
        undo.append(unmount)
        return folder

    yield make
    for step in undo:
        step()


def fill_disk(disk: Path, leave: int = 0) -> Path:
    """Fill the file system of ``disk`` with one file until at most ``leave`` bytes are free."""
    stats = os.statvfs(disk)
    target = max(0, stats.f_bavail * stats.f_frsize - leave)
    filler = disk / "filler"
    with open(filler, "wb") as handle:
        chunk = b"\0" * (1 << 16)
        while target > 0:
            try:
                target -= handle.write(chunk[:target])
                handle.flush()
            except OSError:  # full before the target: as full as it gets
                break
    return filler


# ---- checkpoints written without a run -------------------------------------------------------
def run_state(step: int = 6, world_size: int = 1, value: float = 1.0) -> dict[str, Any]:
    """A small state with the outline a run's checkpoint has (training/checkpoint/state.py): what
    ``checkpoint.newest`` accepts as a run's."""
    return {"position": {"step": step, "epoch": 2, "done": 1}, "replicas_agree": True,
            "shared": {"model": {"w": torch.full((64, 64), value), "b": torch.arange(8.0)},
                       "optimizer": {"state": {}, "param_groups": []}, "scaler": None},
            "ranks": [{"strategy": {}, "rng": {"torch": torch.get_rng_state()},
                       "epoch_part": None, "rows": {}} for _ in range(world_size)],
            "progress": {"epochs": [{"epoch": 1, "train_loss": 2.29, "test_accuracy": None}],
                         "resumed": []}}
