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
from parascale.report.wording import busy_lines, busy_sentence, sentences
from parascale.run_summary import busy_warning
from parascale.runtime.machine import CpuCounters
from parascale.training.observe.contention import machine_section

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


# measured over 3 s on this 2-core machine while a process started short busy Python processes
# one after another (each lived about 0.1 s): the machine was full, yet the processes present at
# both ends of the window used 0.133 cores between them, the largest 0.097
SHORT_LIVED = {"cores": 2, "window_s": 3.0, "other_cores": 2.001, "steal_cores": 0.0,
               "busy": True, "busy_threshold_cores": 0.25,
               "hosts": [{"host": "node1", "cores": 2, "window_s": 3.0, "busy_cores": 2.001,
                          "own_cores": 0.0, "other_cores": 2.001, "steal_cores": 0.0,
                          "busy": True, "load_avg_1m": [2.9, 3.1], "seen_cores": 0.133,
                          "top_others": [{"pid": 2276, "command": "python -u -c import sys",
                                          "cores": 0.097},
                                         {"pid": 77, "command": "kdamond.0", "cores": 0.017}]}],
               "method": "..."}


def test_load_from_processes_too_short_lived_to_name_is_said_to_be_so(tmp_path):
    """Not "the biggest: 0.10 cores" of a machine that 2 other cores kept full."""
    unnamed = "1.87 cores came from processes too short-lived to name"
    largest = "the largest process seen throughout: python -u -c import sys (pid 2276, 0.10 cores)"
    warning = busy_warning(SHORT_LIVED)
    assert "other processes used 2.00 of 2 cores" in warning and largest in warning, warning
    assert unnamed in warning and "biggest" not in warning, warning
    rows = rows_of(tmp_path, [record(2, 1500.0, machine=SHORT_LIVED)])
    for text in [busy_sentence(rows), *busy_lines(rows)]:
        assert unnamed in text and "biggest" not in text, text


def test_a_burners_load_is_named_without_a_remainder_to_explain():
    burner = {**SHORT_LIVED, "other_cores": 1.5, "hosts": [{
        **SHORT_LIVED["hosts"][0], "other_cores": 1.5, "seen_cores": 1.497,
        "top_others": [{"pid": 9, "command": "burner", "cores": 1.49}]}]}
    warning = busy_warning(burner)
    assert "burner (pid 9, 1.49 cores)" in warning and "short-lived" not in warning, warning


def test_the_record_keeps_the_load_of_every_other_process_it_saw():
    """Not only the three it names: the rest of the other load is what none of them explains."""
    a, b = CpuCounters(0.0, 0.0, 0.0), CpuCounters(2.0, 3.0, 0.0)
    used = [{"pid": pid, "command": f"p{pid}", "cores": cores}
            for pid, cores in [(10, 0.5), (11, 0.3), (12, 0.2), (13, 0.1), (14, 0.05), (1, 0.4)]]
    ends = [{"host": "node1", "local_rank": 0, "own_s": 1.0, "pids": [1], "a": a, "b": b,
             "cores": 2, "load_avg_1m": [1.0, 1.0], "used": used}]
    [host] = machine_section(ends)["hosts"]
    assert [p["pid"] for p in host["top_others"]] == [10, 11, 12]  # pid 1 is the job's own
    assert host["other_cores"] == pytest.approx(1.0)
    assert host["seen_cores"] == pytest.approx(1.15)


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
