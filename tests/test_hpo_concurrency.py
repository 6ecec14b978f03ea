"""Two `parascale hpo` commands started at once on a new folder and SQLite file: the same search
twice shares the study (Optuna's tables are created once, under a lock), and another study is
refused in one line, because one --out holds one study."""
from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from conftest import wait_until
from parascale.hpo import space, study
from parascale.hpo.study import CLAIM

pytestmark = pytest.mark.slow

SEARCH = ["hpo", "--model", "smallcnn", "--dataset", "digits", "--param", "lr=0.01:0.1:log",
          "--epochs", "1", "--pruner", "none", "--devices-per-trial", "1"]


def _together(tmp_path, *commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Start every command, then wait for each: they reach the new database at about the same
    moment (each first spends seconds importing torch and checking its options)."""
    procs = [subprocess.Popen([sys.executable, "-m", "parascale", *args], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in commands]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_the_same_search_started_twice_at_once_shares_one_new_study(tmp_path):
    out = tmp_path / "search"
    command = [*SEARCH, "--trials", "2", "--out", str(out)]
    first, second = _together(tmp_path, command, command)
    for proc in (first, second):
        assert proc.returncode == 0, proc.stderr[-3000:]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="parascale", storage=f"sqlite:///{out / 'hpo.db'}").trials
    assert len(trials) >= 2 and all(t.state == TrialState.COMPLETE for t in trials)


def test_two_studies_started_at_once_in_one_out_one_is_refused(tmp_path):
    out = tmp_path / "search"
    done = _together(tmp_path, *[[*SEARCH, "--trials", "1", "--study-name", name, "--out",
                                  str(out)] for name in ("a", "b")])
    codes = sorted(proc.returncode for proc in done)
    assert codes == [0, 2], [proc.stderr[-3000:] for proc in done]
    refused = next(proc for proc in done if proc.returncode == 2)
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "one --out holds one study" in lines[0], refused.stderr
    kept = next(proc for proc in done if proc.returncode == 0)
    name = "a" if "--study-name a" in " ".join(kept.args) else "b"
    assert f'"study_name": "{name}"' in (out / CLAIM).read_text()
    assert optuna.study.get_all_study_names(storage=f"sqlite:///{out / 'hpo.db'}") == [name]


# A trial, a test or a reader opening the study's file: Optuna's first open creates the tables,
# then the version row, then the Alembic stamp. This opener stops just before the stamp (the
# moment a concurrent creator ran into it) until its rival either finished or waits on the lock.
OPENER = """
import os, sys, time
import alembic.runtime.migration as migration
from parascale.studydb import open_storage

url, folder = sys.argv[1], sys.argv[2]
stamp = migration.MigrationContext._ensure_version_table

def waited_on():  # another process blocked in flock() on the folder (/proc/locks' '->' lines)
    inode = f":{os.stat(folder).st_ino} "
    with open("/proc/locks") as locks:
        return any("->" in line and inode in line for line in locks)

def paused(self, *args, **kwargs):
    open(os.path.join(folder, "paused"), "w").close()
    while not (os.path.exists(os.path.join(folder, "rival-done")) or waited_on()):
        time.sleep(0.05)
    return stamp(self, *args, **kwargs)

migration.MigrationContext._ensure_version_table = paused
open_storage(url)
print("opened")
"""


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_a_reader_opening_a_new_study_file_while_the_search_creates_it(tmp_path):
    """Once "UNIQUE constraint failed: alembic_version.version_num": the opener that stamped
    second failed. Every opener now takes the folder's lock, so one waits for the other."""
    folder = tmp_path / "search"
    folder.mkdir()
    url = f"sqlite:///{folder / 'hpo.db'}"
    opener = subprocess.Popen([sys.executable, "-c", OPENER, url, str(folder)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: (folder / "paused").exists() or opener.poll() is not None,
                          120), "the opener never reached the stamp"
        ident = study.identity("accuracy", None, [space.parse_param("lr=0.01:0.1:log")], {})
        created = study.open_study(url, "t", ident, 0, "none")
        (folder / "rival-done").touch()
        out, err = opener.communicate(timeout=120)
    finally:
        if opener.poll() is None:
            opener.kill()
    assert opener.returncode == 0 and out.strip() == "opened", err[-3000:]
    assert optuna.study.get_all_study_names(storage=url) == ["t"]
    assert created.user_attrs["parascale"] == ident
