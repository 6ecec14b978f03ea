"""What else used the CPUs: a run on a busy machine records and names it, a report warns about
it, and --quiet-machine waits for a quiet one."""

import json
import subprocess
import sys
import time

import pytest

from conftest import machine_block, record
from helpers import rows_of, train_here
from parascale.cli.main import main
from parascale.report import format_terminal, write_report
from parascale.report.wording import sentences

# Python busy loops on three threads (hashlib releases the GIL), in a session of its own: Linux's
# autogroup scheduling shares the CPUs between sessions first, so a one-thread burner in the
# test's session gets no more than the processes of other people's tests on a shared machine,
# and need not be among the three a record names
BURNER = ("import hashlib, threading\n"
          "block = bytes(1 << 20)\n"
          "def burn():\n"
          "    while True:\n"
          "        hashlib.sha256(block).digest()\n"
          "for _ in range(3):\n"
          "    threading.Thread(target=burn).start()\n")


@pytest.mark.slow
def test_a_cpu_burner_during_the_run_is_recorded_and_named(tmp_path, capfd):
    burner = subprocess.Popen([sys.executable, "-c", BURNER], start_new_session=True)
    try:
        time.sleep(0.5)
        proc, record = train_here(tmp_path / "run", capfd, "--workers", "1", "--steps", "60")
    finally:
        burner.kill()
        burner.wait()
    machine = record["machine"]
    assert machine["busy"] is True, machine
    assert machine["other_cores"] + machine["steal_cores"] >= machine["busy_threshold_cores"]
    named = [p["pid"] for host in machine["hosts"] for p in host["top_others"]]
    assert burner.pid in named, (burner.pid, machine["hosts"])
    assert machine["window_s"] > 0 and machine["method"]
    for entry in record["epochs"]:
        assert entry["other_cores"] >= 0 and entry["steal_cores"] >= 0
    last = proc.err.strip().splitlines()[-1]
    assert last.startswith("parascale: warning: the CPUs were busy"), proc.err
    assert "other processes used" in last and "pid " in last


def test_runs_on_a_busy_machine_are_warned_about(tmp_path):
    busy = machine_block(other=0.95, command="python -m parascale train --workers 2", pid=777)
    records = [record(1, 1000.0, machine=machine_block(busy=False, other=0.02)),
               record(2, 1500.0, machine=busy), record(4, 2000.0)]  # the last: no machine block
    records[2]["machine"] = None  # an older or failed record: handled
    rows = rows_of(tmp_path, records)
    said = sentences(rows)
    assert said[0].startswith("Warning: 1 of 3 runs ran on a busy machine"), said[0]
    assert "0.95 cores" in said[0] and "python -m parascale train --workers 2" in said[0]
    text = format_terminal(rows)
    assert "N=2" in text and "0.95 other cores of 2" in text and "pid 777" in text
    page = write_report([tmp_path / "study"]).read_text()
    assert "ran on a busy machine" in page and "pid 777" in page


@pytest.mark.slow
def test_quiet_machine_waits_for_a_busy_machine_and_records_what_it_saw(tmp_path, capsys):
    study = tmp_path / "quiet"
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert main(["bench", "--model", "mlp", "--workers", "1", "--steps", "2",
                     "--timeout", "60", "--quiet-machine", "2", "--out", str(study)]) == 0
    finally:
        spinner.kill()
        spinner.wait()
    out = capsys.readouterr().out
    assert "waiting for a quiet machine" in out and "still busy" in out, out
    [found] = [json.loads(p.read_text()) for p in study.glob("runs/*/record.json")]
    seen = found["study"]["quiet_machine"]
    assert seen["quiet"] is False and seen["max_s"] == 2.0
    assert seen["other_cores"] >= seen["busy_threshold_cores"]
    # the biggest other processes, named (the spinner among them unless the shared machine
    # runs bigger ones)
    assert seen["top_others"] and all({"pid", "command", "cores"} <= set(p)
                                      for p in seen["top_others"])


def test_quiet_machine_rejects_a_negative_wait(tmp_path, capsys):
    assert main(["bench", "--model", "mlp", "--workers", "1", "--quiet-machine", "-1",
                 "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "--quiet-machine" in err and "0 or more" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
