"""A worker forked from the fork server applies the MALLOC_MMAP_THRESHOLD_ it is given, as a
fresh interpreter's glibc would (runtime/processes.py; find-batch --sync relies on it)."""
from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from parascale.runtime import processes

# a 4 MiB buffer freed raises glibc's dynamic threshold to 4 MiB, so the next 1 MiB buffer comes
# from the heap; with the threshold fixed at 128 KiB it is mapped on its own (mallinfo2's hblks)
CHILD = """
    import ctypes, json, os, sys

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.mallinfo2.restype = Info
    libc.free(ctypes.c_void_p(libc.malloc(4 << 20)))
    before = libc.mallinfo2().hblks
    block = libc.malloc(1 << 20)
    mapped = libc.mallinfo2().hblks - before
    libc.free(ctypes.c_void_p(block))
    with open(os.environ["ANSWER"], "w") as f:
        json.dump({"mapped": mapped}, f)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_forked_worker_takes_the_threshold_it_is_given(tmp_path):
    (tmp_path / "malloc_child.py").write_text(textwrap.dedent(CHILD))
    mapped = {}
    for given in (None, "131072"):
        answer = tmp_path / f"answer-{given}.json"
        env = {k: v for k, v in os.environ.items() if k != processes.MMAP_ENV}
        env.update(PYTHONPATH=str(tmp_path), ANSWER=str(answer))
        if given:
            env[processes.MMAP_ENV] = given
        child = processes.start_module("malloc_child", env, tmp_path / "log", 1, "malloc-test")
        assert child.wait(120) == 0, (tmp_path / "log").read_text()
        mapped[given] = json.loads(answer.read_text())["mapped"]
    assert mapped == {None: 0, "131072": 1}
