"""The process world, hardened (issue 16): listening sockets, output folders, oversubscription,
results replaced only as a whole, SIGTERM and leftover folders, and the bound on a hung job.

Jobs started here run in a private temporary directory (TMPDIR) so that what they leave
behind is theirs alone, and every process a test looks at is a descendant of its own launcher.
"""
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import wait_until

from parascale.cli.main import main
from parascale.config import TrainConfig
from parascale.runtime.env import available_cores
OVERSUBSCRIPTION = 4  # CPU threads per core a launch may ask for, as --oversubscribe says
STUCK_SLACK_S = 2.0  # a hung job ends this long after --timeout at most, as --timeout says
SCRATCH = ("parascale-job-", "parascale-ps-", "parascale-run-", "parascale-comm-")


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("parascale: error:"), err
    return err[0]


def cli(*args: str, tmpdir: Path | None = None, fault: str | None = None, **popen):
    """``parascale ARGS`` as its own process (in its own TMPDIR when given)."""
    env = {**os.environ}
    env.pop("PARASCALE_FAULT", None)
    if fault:
        env["PARASCALE_FAULT"] = fault
    if tmpdir is not None:
        tmpdir.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmpdir)
    return subprocess.Popen([sys.executable, "-m", "parascale", *args], env=env, text=True,
                            **popen)


def tree(pid: int) -> list[psutil.Process]:
    """The process and its descendants that are alive now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    """Those still running (a zombie, dead but not yet reaped, does not count)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def leftovers(tmpdir: Path) -> list[str]:
    return sorted(p.name for p in tmpdir.iterdir() if p.name.startswith(SCRATCH))


def old_results(out: Path) -> dict[str, bytes]:
    """An earlier run's result set in ``out``, as bytes."""
    out.mkdir(parents=True)
    files = {"record.json": b'{"status": "ok", "note": "the earlier run"}\n',
             "model.pt": b"the earlier run's model"}
    for name, data in files.items():
        (out / name).write_bytes(data)
    return files


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


# -- 1: nothing listens beyond loopback --------------------------------------------------------

def outside_address() -> str | None:
    """An IPv4 address of this machine that is not loopback."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


def connect(address: str, port: int) -> str:
    with socket.socket() as sock:
        sock.settimeout(5)
        try:
            sock.connect((address, port))
        except OSError as exc:
            return type(exc).__name__
    return "accepted"


def test_a_store_for_a_host_elsewhere_listens_on_one_interface_never_on_all():
    """A multi-node world may name a MASTER_ADDR that is not this machine (torchrun's c10d
    rendezvous puts rank 0 anywhere): the store takes this machine's address on the route there."""
    from parascale.runtime.local import address_towards, open_store

    elsewhere = "198.51.100.7"  # TEST-NET-2: documentation only, never an address of this machine
    try:
        expected = address_towards(elsewhere)
    except OSError:
        pytest.skip("this machine has no route beyond loopback")
    store = open_store(host=elsewhere, timeout_s=5)
    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port]
    assert store.host == expected != elsewhere
    assert [a.ip for a in listening] == [expected], listening
    del store


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [["--sync", "allreduce"],
                                      ["--sync", "parameter-server", "--ps-servers", "2"]])
def test_every_listening_socket_of_a_job_is_on_loopback(tmp_path, strategy):
    outside = outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect through")
    # rank 0 sleeps 50 ms a step: 3 s of training, a dozen looks at every process's sockets
    proc = cli("train", "--workers", "2", "--model", "mlp", "--steps", "60", "--timeout", "60",
               "--no-save-model", "--out", str(tmp_path / "run"), *strategy,
               tmpdir=tmp_path / "tmp", fault="slow@0:0.05", stdout=subprocess.DEVNULL,
               stderr=subprocess.PIPE)
    listening: dict[tuple[str, int], tuple[str, str]] = {}  # (ip, port) -> (process, connect)
    while proc.poll() is None:
        for p in tree(proc.pid):
            try:
                sockets = [c for c in p.net_connections(kind="inet")
                           if c.status == psutil.CONN_LISTEN]
                # a worker forked from the fork server has that server's command line
                name = p.name() if p.name().startswith("parascale-r") else \
                    " ".join(p.cmdline()[1:3])
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            for c in sockets:
                if (c.laddr.ip, c.laddr.port) not in listening:
                    listening[c.laddr.ip, c.laddr.port] = (name, connect(outside, c.laddr.port))
        time.sleep(0.25)
    assert proc.wait() == 0, proc.stderr.read()
    kinds = {name for name, _ in listening.values()}
    assert "-m parascale" in kinds, listening  # the launcher's store
    assert {"parascale-r0", "parascale-r1"} <= kinds, listening  # the workers' gloo
    if "parameter-server" in strategy:
        assert "-m parascale.sync.ps_server" in kinds, listening
    beyond = {k: v for k, v in listening.items() if not ipaddress.ip_address(k[0]).is_loopback}
    assert beyond == {}, beyond
    reached = {k: v for k, v in listening.items() if v[1] != "ConnectionRefusedError"}
    assert reached == {}, f"through {outside}: {reached}"


# -- 4: an --out that cannot be written --------------------------------------------------------

def read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write into (root writes into mode 555 folders, not /proc/sys)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    for candidate in (locked, Path("/proc/sys")):
        if candidate.is_dir() and not os.access(candidate, os.W_OK):
            return candidate
    pytest.skip("no folder here that this user cannot write to")


def a_record(folder: Path) -> Path:
    from parascale.record import failure_record

    record = failure_record(TrainConfig(workers=1).to_dict(), "failed", "for the report", None)
    folder.mkdir(parents=True)
    (folder / "record.json").write_text(json.dumps(record))
    return folder


@pytest.mark.parametrize("command", ["train", "bench", "report"])
def test_an_unwritable_out_is_refused_in_one_line(capsys, tmp_path, command):
    out = read_only_folder(tmp_path) / "new" / "run"
    args = {"train": ["train", "--model", "mlp", "--workers", "1", "--steps", "1"],
            "bench": ["bench", "--model", "mlp", "--workers", "1", "--steps", "1"],
            "report": ["report", str(a_record(tmp_path / "study"))]}[command]
    assert main([*args, "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert f"--out {out}" in line and "not writable" in line, line
    assert not out.parent.exists()


@pytest.mark.parametrize("command", ["train", "bench", "hpo"])
def test_an_out_the_file_system_refuses_is_one_line_for_root_too(capsys, command):
    """/proc lets root pass os.access but creates no folder: what a root-squashed share does."""
    out = Path("/proc/parascale-run")
    args = {"train": ["train", "--model", "mlp", "--workers", "1", "--steps", "1"],
            "bench": ["bench", "--model", "mlp", "--workers", "1", "--steps", "1"],
            "hpo": ["hpo", "--model", "mlp", "--param", "lr=0.01:0.1", "--trials", "1"]}[command]
    assert main([*args, "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert f"--out {out}" in line, line
    assert not out.exists()


# -- 6: more workers than the data or the machine can take -------------------------------------

def test_more_workers_than_the_data_says_the_numbers(capsys, tmp_path):
    assert main(["train", "--workers", "10000", "--out", str(tmp_path / "run")]) == 2
    line = one_error_line(capsys)
    assert "10000 workers x batch 32 need 320000 training samples per step; digits has 1437: " \
           "use at most 44 workers at batch 32" in line, line
    assert not (tmp_path / "run").exists()


def test_oversubscription_is_refused_with_the_numbers_unless_insisted():
    from parascale.errors import UsageError
    from parascale.training import preflight

    cores = available_cores()
    many = OVERSUBSCRIPTION * cores + 1
    with pytest.raises(UsageError) as refused:
        preflight(TrainConfig(workers=many, batch_size=1), many)
    assert f"{many} CPU threads ({many} workers x 1 threads) on {cores} cores" in str(refused.value)
    assert "--oversubscribe" in str(refused.value)
    with pytest.raises(UsageError) as threads:
        preflight(TrainConfig(workers=2, threads=100000), 2)
    assert "200000 CPU threads (2 workers x 100000 threads)" in str(threads.value)
    preflight(TrainConfig(workers=many, batch_size=1, oversubscribe=True), many)
    # what the suite runs: 4 workers and 2 parameter servers on 2 cores
    preflight(TrainConfig(workers=2 * cores, global_batch=32, sync="parameter-server",
                          ps_servers=2), 2 * cores)


def test_the_help_states_the_oversubscription_factor(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"more than {OVERSUBSCRIPTION} CPU threads per core" in text
    assert f"at most {STUCK_SLACK_S:g} s later" in text


# -- 14: --out changes only when a run has its own results -------------------------------------

def busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_refused_run_leaves_the_earlier_results_and_no_folder(capsys, tmp_path):
    out = tmp_path / "runs" / "a"
    before = old_results(out)
    with busy_port() as sock:
        port = str(sock.getsockname()[1])
        assert main(["train", "--workers", "1", "--port", port, "--out", str(out)]) == 2
        assert "already in use" in one_error_line(capsys)
        assert contents(out) == before
        assert sorted(p.name for p in out.parent.iterdir()) == ["a"]  # no staging left beside
        fresh = tmp_path / "new" / "deeper" / "run"
        assert main(["train", "--workers", "1", "--port", port, "--out", str(fresh)]) == 2
        one_error_line(capsys)
    assert not (tmp_path / "new").exists()


def test_a_failed_download_leaves_no_empty_folders(capsys, tmp_path):
    try:
        socket.create_connection(("ossci-datasets.s3.amazonaws.com", 443), timeout=3).close()
        pytest.skip("this machine reaches the internet, so the download would succeed")
    except OSError:
        pass
    code = main(["train", "--dataset", "mnist", "--data-dir", str(tmp_path / "data" / "mnist"),
                 "--download", "--out", str(tmp_path / "run")])
    assert code == 2
    one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_failed_run_replaces_the_earlier_results_as_a_whole(tmp_path, monkeypatch):
    import parascale

    out = tmp_path / "run"
    old_results(out)
    monkeypatch.setenv("PARASCALE_FAULT", "raise@1:1")
    record = parascale.train({"workers": 2, "model": "mlp", "steps": 3, "timeout": 30.0,
                              "out": str(out)})
    assert record["status"] == "failed"
    # not the earlier run's model beside it; its own log, to read what happened
    assert sorted(contents(out)) == ["log.txt", "record.json"]
    assert json.loads((out / "record.json").read_text()) == record
    assert record["config"]["out"] == str(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def began(proc: subprocess.Popen) -> bool:
    """Read the job's output until rank 0's banner (training is about to begin); False at EOF.
    Start-up messages ("checking...", "starting 2 workers...") come first."""
    for line in iter(proc.stdout.readline, ""):
        if line.startswith("parascale: mlp on digits"):
            return True
    return False


# -- 15: SIGTERM like Ctrl-C; no folders left behind -------------------------------------------

@pytest.mark.slow
def test_sigterm_stops_the_job_like_ctrl_c_and_changes_nothing(tmp_path):
    out = tmp_path / "runs" / "a"
    before = old_results(out)
    proc = cli("train", "--workers", "2", "--model", "mlp", "--steps", "100000", "--sync",
               "parameter-server", "--out", str(out), tmpdir=tmp_path / "tmp",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert began(proc), "training never began"
    procs = tree(proc.pid)  # launcher, fork server, its resource tracker, 2 workers, 1 server
    pids = [p.pid for p in procs]
    assert sorted(p.name() for p in procs if p.name().startswith("parascale-r")) == \
        ["parascale-r0", "parascale-r1"]
    assert sum("parascale.sync.ps_server" in p.cmdline() for p in procs) == 1, procs
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert stderr.strip().splitlines() == ["parascale: terminated (SIGTERM)"], stderr
    assert wait_until(lambda: not alive(pids), 5.0), alive(pids)  # servers die with rank 0
    assert leftovers(tmp_path / "tmp") == []
    assert contents(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["a"]


@pytest.mark.slow
def test_folders_of_a_killed_launcher_are_removed_by_the_next_launch(tmp_path):
    tmpdir = tmp_path / "tmp"
    proc = cli("train", "--workers", "2", "--model", "mlp", "--steps", "100000", "--sync",
               "parameter-server", "--out", str(tmp_path / "run"), tmpdir=tmpdir,
               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert began(proc), "training never began"
    pids = [p.pid for p in tree(proc.pid)]
    proc.kill()
    proc.wait()
    assert wait_until(lambda: not alive(pids), 30.0), alive(pids)
    left = leftovers(tmpdir)
    assert any(n.startswith("parascale-job-") for n in left), left
    assert any(n.startswith("parascale-ps-") for n in left), left
    staging = [p.name for p in tmp_path.iterdir() if p.name.startswith(".run.")]
    assert staging, "the killed run's staging folder"
    again = cli("train", "--workers", "1", "--model", "mlp", "--steps", "1",
                "--no-save-model", "--out", str(tmp_path / "run"), tmpdir=tmpdir,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert again.wait(timeout=300) == 0, again.stderr.read()
    assert leftovers(tmpdir) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "tmp"]


@pytest.mark.slow
def test_sigterm_leaves_a_study_resumable_as_ctrl_c_does(tmp_path):
    study = tmp_path / "study"
    args = ["bench", "--model", "mlp", "--workers", "1", "-V", "steps=2,200", "--out", str(study)]
    proc = cli(*args, tmpdir=tmp_path / "tmp", fault="slow@0:0.1", stdout=subprocess.DEVNULL,
               stderr=subprocess.PIPE)
    assert wait_until(lambda: len(list(study.glob("runs/*/record.json"))) == 1
                      or proc.poll() is not None, 300.0), "the first run was never filed"
    time.sleep(1.0)  # the second run is under way
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    lines = stderr.strip().splitlines()
    assert lines[-1] == "parascale: terminated (SIGTERM)", stderr
    assert lines[-2].startswith(f"interrupted: 1 of 2 runs are recorded in {study}; to resume"), \
        stderr
    assert leftovers(tmp_path / "tmp") == []
    again = cli(*args, tmpdir=tmp_path / "tmp", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr
    assert "1 of 2 runs already done" in stdout
    statuses = [json.loads(p.read_text())["status"] for p in study.glob("runs/*/record.json")]
    assert statuses == ["ok", "ok"]


# -- 16: a hung worker ends the job within the stated bound ------------------------------------

@pytest.mark.slow
def test_a_hung_worker_ends_the_job_within_timeout_and_the_stated_slack(tmp_path):
    """Rank 1 hangs before step 3. Its processes ignore SIGTERM, as a worker stuck in native
    code does when a library installed a Python SIGTERM handler (which can never run there).
    The job must end within --timeout + STUCK_SLACK_S of the hang, with 3 s to spare for a busy
    machine; counting a grace period for the hung worker (5 s) breaks that."""
    timeout = 5.0
    proc = cli("train", "--workers", "2", "--model", "mlp", "--epochs", "2", "--timeout",
               str(timeout), "--no-save-model", "--out", str(tmp_path / "run"),
               tmpdir=tmp_path / "tmp", fault="hang@1:3", stdout=subprocess.PIPE,
               stderr=subprocess.PIPE,
               preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    assert began(proc), "training never began"
    hung = time.monotonic()  # two steps of an mlp later, rank 1 hangs: this is no later
    _, stderr = proc.communicate(timeout=120)
    ended = time.monotonic() - hung
    assert proc.returncode == 1
    assert "rank 1 stopped responding" in stderr
    assert ended <= timeout + STUCK_SLACK_S + 3.0, f"the job ended {ended:.1f} s after the hang"
