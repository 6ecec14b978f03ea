"""Logs every process started while the test suite's costs are measured (.ci/costs/README.md).

Python imports ``sitecustomize`` at every interpreter's start when it is on ``sys.path``: with
this folder on ``PYTHONPATH`` and ``SUITE_COSTS`` naming a folder, each Python process of the
run (pytest's workers, the commands tests start, fork servers, torchrun's agents) appends a
line to ``SUITE_COSTS/starts.jsonl`` when it starts, when it forks (a fork server's workers),
and when it starts a program that is not Python (``git``, ``ip``, Chromium). Without
``SUITE_COSTS`` it does nothing."""
import json
import os
import sys
import time

_FOLDER = os.environ.get("SUITE_COSTS")


def _cgroup() -> str:
    """This process's cpuacct cgroup: the pytest worker whose test started it."""
    try:
        with open("/proc/self/cgroup") as lines:
            for line in lines:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "cpuacct" in controllers.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return ""


def _log(kind: str, what: object) -> None:
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "cgroup": _cgroup(), "kind": kind,
                       "what": str(what)[:160]}) + "\n"
    try:  # one write of a short line with O_APPEND: lines of many processes do not interleave
        fd = os.open(os.path.join(_FOLDER, "starts.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _audit(event: str, args: tuple) -> None:
    if event == "subprocess.Popen":
        program = os.path.basename(str(args[0] or (args[1][0] if args[1] else "")))
        if "python" not in program:  # a Python program logs its own start
            _log("program", [str(a) for a in (args[1] or [])][:4])


if _FOLDER:
    _log("python", getattr(sys, "argv", [])[:4])
    os.register_at_fork(after_in_child=lambda: _log("fork", ""))
    sys.addaudithook(_audit)
