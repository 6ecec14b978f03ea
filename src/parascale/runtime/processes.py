"""Start, watch and stop the processes of a local job: workers and parameter servers.

Workers fork from a *fork server* (``multiprocessing``'s forkserver) that has imported torch
and the worker code once, for the life of the launching process: a study, or a test session,
pays that import once instead of once per worker per configuration. The server only imports
(no thread, CUDA context or random draw of its own), and every worker is a fresh fork of it,
never of the launcher or of an earlier configuration's worker (see docs/design.md, "Start-up:
the fork server").

A fork inherits the server's environment, working folder, ``sys.path`` and output from when the
server started, so each child first takes the launcher's as they are at launch time: the
environment and the job's variables, the working folder and ``sys.path``, and the output file
descriptors passed to it (rank 0 writes where the launcher writes now, other ranks to their log
file). libgomp reads ``OMP_NUM_THREADS`` when torch is imported, in the server, so the child
sets its thread count itself.

Die with the launcher: the server dies with the launcher, and each child with the server
(Linux's parent-death signal, see :mod:`.fork_server_init`). Each worker leads a process group
of its own, which whatever it starts joins (a script's ``subprocess.Popen``, ``multiprocessing``
and DataLoader children): :func:`stop` signals the whole group, so none of them outlives the
job, even one orphaned when its worker ended. Processes
that need a fresh interpreter (parameter servers) are started with :func:`start_command`.

Where this Python lacks one of the private parts of ``multiprocessing`` this relies on
(:mod:`.mp_private`), each process is started as a fresh interpreter instead (:func:`start_module`
says how), the same in all but start-up time.

This module imports neither torch nor the rest of the runtime, so that a launcher can start the
fork server before its own ``import torch``, and both imports run at once.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from parascale import safejson
from parascale.runtime import mp_private

#: what the fork server imports once: everything a training or comm worker imports on start
#: (not the worker modules themselves: runpy would warn that they were imported before it ran them).
#: torch._dynamo is imported by DistributedDataParallel's constructor (1.9 s here). Not the data
#: sets' libraries (scikit-learn 1.5 s, torchvision 3.5 s): the launcher hands its workers the
#: data it built (``parascale.data.handover``), and the server's imports are a run's critical path.
PRELOAD = ["parascale.runtime.fork_server_init", "torch", "torch.distributed", "torch._dynamo",
           "parascale.training.loop.train", "parascale.comm"]
LOG_TAIL = 12  # lines of a failed process's log shown to the user


def _context():
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    _short_socket_folder()
    return ctx


#: the fork server listens on a Unix socket in multiprocessing's temporary folder; Linux limits
#: its path to 107 bytes, and multiprocessing adds about 40 to $TMPDIR
LONGEST_TMPDIR = 60


def _short_socket_folder() -> None:
    """Under a long $TMPDIR the fork server cannot bind its socket ("AF_UNIX path too long"):
    multiprocessing's folder then goes to /tmp, removed at exit as its own would be."""
    import tempfile
    from multiprocessing import util

    config = mp_private.process_config()
    if config is None or "tempdir" in config or len(os.fsencode(tempfile.gettempdir())) <= LONGEST_TMPDIR \
            or not os.path.isdir("/tmp"):
        return
    folder = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    config["tempdir"] = folder
    util.Finalize(None, shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True},
                  exitpriority=-100)


def warm() -> None:
    """Start the fork server now, without waiting for its imports: they overlap whatever this
    process does next. Idempotent; a server that died is started again. Nothing where processes
    start as fresh interpreters (:func:`start_module`)."""
    from multiprocessing import forkserver

    if not mp_private.usable():
        return
    _context()
    forkserver.ensure_running()


#: whether this process was forked from the fork server (by :func:`start_module`)
_forked = False


def fork_own_server() -> bool:
    """Give this process a fork server of its own by forking it, instead of starting a fresh
    interpreter that imports torch again (seconds of CPU). Only for a process forked from the
    fork server that will start processes of its own (an HPO trial starts its workers), called
    first thing: it holds what the server imported and nothing a run did yet, so a fork of it
    is such a server, and it has no thread to lose. The server runs multiprocessing's own loop
    until this process has gone, and dies with it. False, with nothing done, where this process
    was not forked from the fork server."""
    if not (_forked and mp_private.usable()) or mp_private.forkserver_pid() is not None:
        return False
    import socket

    _context()  # the socket's folder: a short one under a long $TMPDIR
    address = mp_private.socket_address()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(alive_w)
                die_with_parent()
                if os.getppid() == parent:  # else it died before the signal was armed
                    mp_private.serve_forks(listener.fileno(), alive_r)  # until alive_w closes
            except SystemExit:
                pass
            except BaseException:  # noqa: BLE001 - its clients then fail, naming the error
                sys.excepthook(*sys.exc_info())
            finally:
                os._exit(0)
    os.close(alive_r)
    mp_private.adopt_forkserver(address, alive_w, pid)
    return True


def exit_now(code: int) -> NoReturn:
    """Leave at once, without Python's clean-up or C++ destructors (after importing torch they
    took seconds, and a joined process group's can hang: see ``runtime.world.joined``). Output is
    flushed first, and multiprocessing's own clean-up, which ``os._exit`` skips, still runs: the
    fork server's socket folder would otherwise be left behind."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader that went away
            pass
    mp_private.run_finalizers()
    _stop_helpers()
    os._exit(code)


def _stop_helpers(wait_s: float = 5.0) -> None:
    """multiprocessing's fork server and resource tracker leave by themselves once this process
    is gone, but under load that takes seconds, and whoever watches for leftovers (a test, a
    scheduler's cgroup, a user's ``ps``) sees them running after the command ended. Whatever they
    served has been stopped by now, or dies with the fork server."""
    pid = mp_private.forkserver_pid() if "multiprocessing.forkserver" in sys.modules else None
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    fd, pid = mp_private.tracker() if "multiprocessing.resource_tracker" in sys.modules \
        else (None, None)
    if fd is None or not pid:
        return
    os.close(fd)  # its end of the pipe: it cleans up and leaves once every holder has closed it
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.02)


def _prctl(option: int, *args) -> bool:
    """Linux's prctl; False where there is none."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, *args) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> bool:
    """This process gets SIGKILL when its parent dies, even by SIGKILL (Linux), instead of
    running on as an orphan. False where that cannot be arranged (not Linux): children may then
    outlive a killed parent."""
    return _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def exit_text(code: int | None) -> str:
    """'is still running', 'was killed by SIGKILL' or 'exited with code C'."""
    if code is None:
        return "is still running"
    return f"was killed by {signal_name(code)}" if code < 0 else f"exited with code {code}"


def tail(log: Path | None, label: str, lines: int = LOG_TAIL) -> str:
    """The last ``lines`` non-empty lines of ``log`` on one line, each marked with ``label``."""
    try:
        text = log.read_text(errors="replace") if log else ""
    except OSError:
        return ""
    return " | ".join(f"{label}{line}" for line in text.strip().splitlines()[-lines:]
                      if line.strip())


class _Fd:
    """A file descriptor that crosses to the fork server's child (pickled as a dup)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def _forked_main(module: str, env: dict[str, str], cwd: str, path: list[str], out: int,
                 err: int, threads: int, server: int, title: str) -> None:
    """Runs in the fork server's child: become the launcher's process of this moment, then run
    ``module`` as ``python -m module`` would."""
    import multiprocessing

    from parascale.runtime.memory_cap import enter

    global _forked
    _forked = True
    die_with_parent()
    os.setpgid(0, 0)  # a group of its own, for stop() to end with whatever it starts
    _set_title(title)
    if os.getppid() != server:  # the server died before the parent-death signal was armed
        os._exit(1)
    # the server exits when every holder of its 'alive' pipe has closed it: only the launcher may
    mp_private.drop_forkserver_alive_fd()
    # as in a fresh interpreter: Linux's default start method and no resource tracker yet (a
    # worker's named semaphores, e.g. tqdm's lock, would be reported leaked by the shared one)
    multiprocessing.set_start_method("fork", force=True)
    mp_private.forget_tracker()
    for fd, target in ((out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    enter(env)  # its --device-memory cgroup, before it allocates more than these few objects
    server_threshold = os.environ.get(MMAP_ENV)
    os.environ.clear()
    os.environ.update(env)
    if env.get(MMAP_ENV, server_threshold) != server_threshold:
        _mmap_threshold(env[MMAP_ENV])
    os.chdir(cwd)
    # torch and numpy seed their global generators from entropy at import, which happened once,
    # in the server: each child draws its own seed, as a fresh interpreter does
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    _run(module, env, path, threads, reseed=True)


#: glibc reads it once, when a process starts; a child forked from the fork server inherits the
#: server's allocator, so the child applies the one it is given itself (batchfind/sharded.py)
MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)


def map_large_buffers(threshold: int) -> None:
    """This process's allocations of ``threshold`` bytes and more are mapped and unmapped on
    their own from now on (glibc's mallopt), unless MALLOC_MMAP_THRESHOLD_ says otherwise."""
    if MMAP_ENV not in os.environ:
        _mmap_threshold(str(threshold))


def _mmap_threshold(text: str) -> None:
    """mallopt(M_MMAP_THRESHOLD): allocations above it are mapped and unmapped on their own (and
    the threshold no longer rises as buffers are freed). Not glibc, or not a number: unchanged."""
    import ctypes

    if not (text.strip().isascii() and text.strip().isdigit()):
        return
    try:  # the process's own symbols, libc's among them (find_library would run ldconfig)
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, int(text))
    except (OSError, AttributeError):
        pass


def _run(module: str, env: dict[str, str], path: list[str], threads: int, reseed: bool) -> None:
    """Run ``module`` as ``python -m module`` would, with the launcher's ``sys.path``."""
    import runpy

    # a PYTHONPATH given for this job counts as it would for a fresh interpreter
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in path]
    sys.path[:] = extra + path
    sys.argv = [module]
    import torch

    if reseed:
        torch.seed()
    torch.set_num_threads(threads)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def plain_main() -> None:
    """A fresh interpreter's part of :func:`start_module` without the fork server:
    ``python -c ... MODULE THREADS TITLE PATH-AS-JSON``."""
    import json

    from parascale.runtime.memory_cap import enter

    enter(dict(os.environ))  # its --device-memory cgroup, before torch is imported
    module, threads, title, path = sys.argv[1:5]
    _set_title(title)
    _run(module, dict(os.environ), json.loads(path), int(threads), reseed=False)


def _set_title(title: str) -> None:
    """The name ps, top and psutil show (the command line stays the fork server's)."""
    _prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME


class Child:
    """One started process, forked or executed: poll, signal, wait."""

    def __init__(self, proc, own_group: bool = True):
        self._proc = proc
        self.pid = proc.pid
        #: it leads a process group (its pid), which :func:`stop` signals whole
        self.own_group = own_group

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if isinstance(self._proc, subprocess.Popen):
            return self._proc.poll()
        return self._proc.exitcode

    def send(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None) -> int | None:
        """The exit code, or None if it still runs after ``timeout`` seconds."""
        if isinstance(self._proc, subprocess.Popen):
            try:
                return self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        self._proc.join(timeout)
        return self._proc.exitcode


def start_module(module: str, env: dict[str, str], log: Path | None, threads: int,
                 title: str) -> Child:
    """Run ``module`` as ``python -m module`` would, forked from the fork server, with ``env``
    (the whole environment) and output to ``log``, or where this process's output goes now;
    ``title``: the process name ps shows (15 bytes at most).

    Where a private part of ``multiprocessing`` that the fork server needs is missing
    (:func:`.mp_private.usable`), the process is a fresh interpreter started with
    :func:`start_command` instead: it imports torch itself, and so starts seconds later."""
    from multiprocessing import forkserver

    if not mp_private.usable():
        return _start_plain(module, env, log, threads, title)
    ctx = _context()
    forkserver.ensure_running()
    server = mp_private.forkserver_pid()
    handle = open(log, "wb") if log is not None else None  # noqa: SIM115 - closed below
    try:
        out, err = (handle.fileno(), handle.fileno()) if handle else (1, 2)
        proc = ctx.Process(target=_forked_main, name=module, args=(
            module, env, os.getcwd(), list(sys.path), _Fd(out), _Fd(err), threads, server, title))
        with _no_main():
            proc.start()
    finally:
        if handle is not None:
            handle.close()
    return Child(proc)


def _start_plain(module: str, env: dict[str, str], log: Path | None, threads: int,
                 title: str) -> Child:

    # the launcher's sys.path first: this parascale, not one the job's PYTHONPATH may name
    code = ("import json, sys; sys.path[:] = json.loads(sys.argv[4]); "
            "from parascale.runtime.processes import plain_main; plain_main()")
    return start_command([sys.executable, "-c", code, module, str(threads), title,
                          safejson.dumps(sys.path)], env, log, cwd=os.getcwd(), own_group=True)


@contextlib.contextmanager
def _no_main() -> Iterator[None]:
    """multiprocessing would have the child run the caller's main script again (as
    ``__mp_main__``): a user's script that calls ``parascale.train()`` at its top level would
    then fail in every worker, and one with a main guard would still pay its imports. The worker
    needs nothing from it, so the child is told there is none."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def start_command(argv: list[str], env: dict[str, str], log: Path | None,
                  cwd: str | None = None, own_group: bool = False) -> Child:
    """Execute ``argv`` (a fresh interpreter), dying with this process; output to ``log``.
    ``own_group``: it leads a process group of its own, as a worker does (module docstring)."""
    handle = open(log, "wb") if log is not None else None  # noqa: SIM115 - closed below
    try:
        return Child(subprocess.Popen(argv, env=env, stdout=handle, stderr=handle, cwd=cwd,
                                      stdin=subprocess.DEVNULL,
                                      preexec_fn=_worker_start if own_group else die_with_parent),
                     own_group)
    finally:
        if handle is not None:
            handle.close()


def _worker_start() -> None:
    die_with_parent()
    os.setpgid(0, 0)


def stop(children: list[Child], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; with no grace, SIGKILL at once. Returns when
    every one has exited, and so has every process they had started: the members of their
    process groups, even those whose worker has ended, and their descendants (a trial's workers
    and its fork server outlive it by a moment otherwise, and a caller that exits then leaves
    them). SIGTERM goes to the children and their groups at once (a descendant outside the
    groups, such as a trial's own workers, is the child's to stop), and all share one grace
    period: a job whose processes exit at SIGTERM ends at once, and one that ignores it after
    ``grace_s``, however many processes it has."""
    groups = [c.pid for c in children if c.own_group]
    others = _family(children, groups)
    if grace_s > 0:
        _signal(children, groups, [], signal.SIGTERM)
        if _wait(children, others, time.monotonic() + grace_s):
            return
        others = _family(children, groups, others)  # and any started meanwhile
    _signal(children, groups, others, signal.SIGKILL)
    for child in children:
        child.wait(None)
    _wait(children, others, time.monotonic() + KILLED_WAIT_S)


#: how long processes that were sent SIGKILL, other than the caller's own children, may take
#: to be gone before stop() returns without them (one in uninterruptible sleep takes its time)
KILLED_WAIT_S = 5.0


def _family(children: list[Child], groups: list[int], known: list | None = None) -> list:
    """Every process other than ``children`` to stop with them, as psutil processes: their
    descendants and the members of their process groups."""
    import psutil  # here: the command line imports this module before it needs psutil

    from parascale.runtime.machine import descendants

    found = {p.pid: p for p in known or []}
    for child in children:
        if child.poll() is None:
            found.update((p.pid, p) for p in descendants(child.pid))
    if groups:
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) in groups:
                    found.setdefault(proc.pid, proc)
            except (ProcessLookupError, PermissionError):
                pass
    own = {c.pid for c in children}
    return [p for pid, p in found.items() if pid not in own and pid != os.getpid()]


def _signal(children: list[Child], groups: list[int], others: list, sig: int) -> None:
    """``sig`` to every one at once: the children themselves (a worker may not have made its
    group yet), their groups, and ``others``."""
    import psutil

    for child in children:
        child.send(sig)
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in others:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def _wait(children: list[Child], others: list, deadline: float) -> bool:
    """Until ``deadline``, wait for all of them to be gone (a zombie counts as gone: it no longer
    runs, and a container's init may never reap it); whether they are."""
    while True:
        running = any(c.poll() is None for c in children) or any(_runs(p) for p in others)
        if not running or time.monotonic() >= deadline:
            return not running
        time.sleep(0.02)


def _runs(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
