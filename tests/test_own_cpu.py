"""A rank's own CPU time: this process, its live descendants (found by a walk of /proc made at
most once per refresh) and its reaped children."""
import subprocess
import sys

import pytest

from parascale.runtime import machine

# the child burns 0.5 s and the checks ask for 0.3: /proc's counts are in clock ticks, sampled
# (a loaded machine misattributes a few), while the child's own clock is exact
BURN = "import sys,time\nt=time.process_time()\nwhile time.process_time()-t<0.5: pass\n" \
       "print('done', flush=True)\nsys.stdin.read()"


def test_the_walk_for_descendants_is_made_once_per_refresh(monkeypatch):
    walks = []
    monkeypatch.setattr(machine, "descendants", lambda: walks.append(1) or [])
    own = machine.OwnCpu(refresh_s=3600)
    first, second = own(), own()
    assert len(walks) == 1 and second >= first > 0


@pytest.mark.slow
def test_a_live_child_counts_once_a_walk_has_found_it():
    own = machine.OwnCpu(refresh_s=0)  # a walk at every reading
    before = own()
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"  # it has burnt its 0.5 s, and lives
        assert own() - before >= 0.3
    finally:
        child.communicate("")
    assert own() - before >= 0.3  # reaped: getrusage counts it now
