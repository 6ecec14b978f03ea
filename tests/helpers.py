"""Helpers that several test modules share (conftest.py holds the fixtures, the fast tier's
guard and the record writer). Not a test module: tests import from here, never from each other."""

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from conftest import record, write_study
from parascale.cli.main import main
from parascale.report import load_records, summary_rows

# ---- studies, records and reports -----------------------------------------------------------

TINY = {"model": "mlp", "dataset": "digits", "steps": 2, "timeout": 60.0}
NESTED = "[" * 100_000 + "]" * 100_000  # 200 KB of brackets


def record_at(folder: str, *args, **kwargs) -> dict:
    """A record from conftest, filed under runs/``folder`` (not under its model name,
    which may be long or strange)."""
    data = record(*args, **kwargs)
    data["study"]["config_id"] = folder
    return data


def rows_of(tmp_path: Path, records: list[dict]):
    """The report's summary rows of ``records``, filed as one study."""
    loaded = load_records([write_study(tmp_path / "study", records)])
    return summary_rows(loaded.records)


def repeats(n: int, throughputs: list[float], **options) -> list[dict]:
    """One record per repeat of N workers, with the stated steady throughputs."""
    return [record(n, x, repeat=i, **options) for i, x in enumerate(throughputs, 1)]


def with_ids(records: list[dict]) -> list[dict]:
    """Distinct run folders for repeats (the helper's config ids name the repeat)."""
    for i, rec in enumerate(records):
        rec["study"]["config_id"] += f"-{i}"
    return records


# ---- refused input -----------------------------------------------------------------------------

def run_cli(capsys, *args) -> tuple[int, str]:
    code = main(["train", *args])
    return code, capsys.readouterr().err


def assert_refused(capsys, tmp_path, *args, words=()) -> str:
    """Exit code 2, one line naming ``words``, nothing written."""
    out = tmp_path / "out"
    code, err = run_cli(capsys, *args, "--out", str(out))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("parascale: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()
    return lines[0]


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


def one_error_line(capsys) -> str:
    """The one line of a usage error (``parascale: error: ...``) on stderr."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("parascale: error:"), err
    return err[0]


# ---- commands as their own processes ----------------------------------------------------------

@dataclass
class Finished:
    """What a command run in this process ended with: as a subprocess's, exit code and output."""

    returncode: int
    stdout: str
    stderr: str


def train_captured(tmp_path, capfd, *args: str, fault: str | None = None) -> tuple[Finished, dict]:
    """``parascale train ARGS`` (with PARASCALE_FAULT ``fault``) into tmp_path/run, run in this
    process, whose fork server is warm (a subprocess would start its own, seconds of CPU): its
    exit code, what it and its workers printed (captured at the file descriptors, where rank 0
    writes too), and its record."""
    capfd.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        if fault:
            patch.setenv("PARASCALE_FAULT", fault)
        else:
            patch.delenv("PARASCALE_FAULT", raising=False)
        code = main(["train", *args, "--timeout", "30", "--out", str(tmp_path / "run")])
    output = capfd.readouterr()
    return Finished(code, output.out, output.err), \
        json.loads((tmp_path / "run" / "record.json").read_text())


OVERSUBSCRIPTION = 4  # CPU threads per core a launch may ask for, as --oversubscribe says
STUCK_SLACK_S = 2.0  # a hung job ends this long after --timeout at most, as --timeout says
SCRATCH = ("parascale-job-", "parascale-ps-", "parascale-run-", "parascale-comm-")


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


def began(proc: subprocess.Popen) -> bool:
    """Read the job's output until rank 0's banner (training is about to begin); False at EOF.
    Start-up messages ("checking...", "starting 2 workers...") come first."""
    for line in iter(proc.stdout.readline, ""):
        if line.startswith("parascale: mlp on digits"):
            return True
    return False


# digits: 1437 training samples; a global batch of 64 gives 22 steps per epoch
SMALL = ["--model", "mlp", "--dataset", "digits", "--global-batch", "64", "--timeout", "60",
         "--no-save-model"]


def train_here(out, capfd, *args):
    """``parascale train`` run in this process, whose fork server is warm: (output, record)."""
    capfd.readouterr()
    code = main(["train", *SMALL, *args, "--out", str(out)])
    output = capfd.readouterr()
    assert code == 0, output.err
    return output, json.loads((out / "record.json").read_text())


# ---- TensorBoard event files (--tensorboard) ----------------------------------------------

def series(folder: Path) -> dict[str, dict[int, float]]:
    """Every scalar series in ``folder``'s event files (read by TensorBoard's own reader):
    tag -> {epoch: value}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}


def assert_matches(found: dict[str, dict[int, float]], epochs: list[dict]) -> None:
    """Each epoch's figures in the record are each series' value at that epoch (the event
    format keeps float32), and there is no series the record does not hold."""
    from parascale.training.observe.tensorboard import scalars

    wanted: dict[str, dict[int, float]] = {}
    for entry in epochs:
        for tag, value in scalars(entry).items():
            wanted.setdefault(tag, {})[entry["epoch"]] = value
    assert set(found) == set(wanted)
    for tag, values in wanted.items():
        assert found[tag] == {e: pytest.approx(v, rel=1e-6) for e, v in values.items()}, tag


# ---- Slurm job scripts ------------------------------------------------------------------------

def srun_words(script: str) -> list[str]:
    """The srun command of a script as the shell splits it (continuation lines joined)."""
    text = script.replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("srun "))
    return shlex.split(line)
