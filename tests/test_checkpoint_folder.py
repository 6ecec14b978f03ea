"""The checkpoints folder is checked before any worker starts: a file, a read-only folder, or
something in the way of a checkpoint's or the log's file is one line, exit code 2, nothing
written."""
from __future__ import annotations

import os

import pytest

from conftest import one_line_error
from parascale.cli.main import main

RUN = ["--workers", "1", "--dataset", "digits", "--model", "mlp", "--steps", "2"]
MODES = {"checkpoint-every": ["--checkpoint-every", "1"], "resume": ["--resume"]}


def snapshot(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): os.readlink(p) if p.is_symlink() else "dir"
            if p.is_dir() else p.read_bytes().hex() for p in sorted(folder.rglob("*"))}


def refused(capsys, out, mode: str) -> str:
    capsys.readouterr()
    before = snapshot(out.parent)
    code = main(["train", *RUN, *MODES[mode], "--out", str(out)])
    line = one_line_error(capsys)
    assert code == 2 and line.startswith("parascale: error: "), line
    assert snapshot(out.parent) == before  # nothing written, nothing removed
    return line


@pytest.mark.parametrize("mode", MODES)
def test_checkpoints_as_a_file_is_refused(tmp_path, capsys, mode):
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("not a folder")
    line = refused(capsys, out, mode)
    assert f"{out}/checkpoints is not a folder" in line and "choose another --out" in line


@pytest.mark.parametrize("mode", MODES)
def test_a_read_only_checkpoints_folder_is_refused(tmp_path, capsys, read_only_folder, mode):
    out = tmp_path / "run"
    read_only_folder(out / "checkpoints")
    line = refused(capsys, out, mode)
    assert f"the checkpoints folder {out}/checkpoints" in line, line
    assert "not writable" in line or "Read-only file system" in line, line


@pytest.mark.parametrize("name", ["step-00000099.pt", "step-00000099.json", "log.txt"])
@pytest.mark.parametrize("mode", MODES)
def test_a_folder_where_a_checkpoint_file_belongs_is_refused(tmp_path, capsys, mode, name):
    out = tmp_path / "run"
    (out / "checkpoints" / name).mkdir(parents=True)
    line = refused(capsys, out, mode)
    assert f"{out}/checkpoints/{name} is a folder, where the run writes its" in line, line
    assert "remove it or choose another --out" in line


def test_a_dangling_link_named_checkpoints_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    os.symlink(tmp_path / "gone", out / "checkpoints")
    assert "checkpoints is not a folder" in refused(capsys, out, "checkpoint-every")
