"""--out: refused in one line when it cannot be written, and replaced only as a whole, by a run
with its own results."""

import json
import os
import socket
from pathlib import Path

import pytest

from helpers import contents, old_results, one_error_line
from parascale.cli.main import main
from parascale.config import TrainConfig


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
    from parascale.runrecord import failed

    record = failed(TrainConfig.of(workers=1).to_dict(), "failed", "for the report", None).to_dict()
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


@pytest.mark.slow
def test_a_run_without_out_returns_its_record_and_writes_nothing(tmp_path, monkeypatch):
    import parascale

    monkeypatch.chdir(tmp_path)
    record = parascale.train({"workers": 1, "model": "mlp", "steps": 2})
    assert record["status"] == "ok" and record["config"]["out"] is None
    assert list(tmp_path.iterdir()) == []


TINY_RUN = ["--model", "mlp", "--workers", "1", "--steps", "1"]


@pytest.mark.parametrize("args", [
    ["train", *TINY_RUN, "--out", ""],
    ["train", *TINY_RUN, "--out", "  "],
    ["train", *TINY_RUN, "--tensorboard", ""],
    ["train", *TINY_RUN, "--data-dir", " "],
    ["bench", *TINY_RUN, "--dry-run", "--out", ""],
    ["bench", *TINY_RUN, "--dry-run", "--tensorboard", ""],
    ["run", "--out", "", "train.py"],
    ["hpo", "--model", "mlp", "--param", "lr=0.01:0.1", "--trials", "1", "--out", ""],
    ["find-batch", "--model", "mlp", "--out", " "],
    ["find-batch", "--model", "mlp", "--data-dir", ""],
    ["slurm", "train", *TINY_RUN, "--time", "10", "--dry-run", "--out", ""],
    ["predict", "study", "--out", ""],
    ["report", "study", "--out", ""],
    ["comm", "--workers", "1", "--out", ""],
    ["demo", "--out", ""],
    ["demo", "--tensorboard", "\t"],
])
def test_an_empty_path_is_refused_in_one_line(capsys, tmp_path, monkeypatch, args):
    """An empty --out wrote nowhere ("record: /record.json") or into the working folder, and an
    empty --tensorboard was silently off: each is one line naming the option, before anything."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('never run')\n")
    assert main(args) == 2
    line = one_error_line(capsys)
    option = args[args.index(next(a for a in args if not a.strip())) - 1]
    assert option in line and "empty" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_an_empty_out_from_the_python_api_is_refused():
    from parascale.errors import UsageError
    from parascale.training import train

    with pytest.raises(UsageError, match="--out '' is empty"):
        train({"model": "mlp", "workers": 1, "steps": 1, "out": ""})
