"""Studies over a user's own training script (``parascale bench --script train.py``).

A script's study is a train study whose runs are ``parascale run`` launches: the study names
``script`` (the file) and ``script_args`` (its arguments: one string, split as a shell would, or
a list), and like any value they may be variables or refer to others, so that
``-P 'b=$(256 // ${workers})$' -P 'script_args=--batch-size ${b}'`` is a strong-scaling study
of a script that takes its batch as an argument. Only ``parascale run``'s options apply to such
runs (where they run, how they synchronise, how they end); the model, data, batch and length
are the script's own, so a train option such as --epochs is refused, naming --script-args.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from parascale.errors import UsageError

SCRIPT, SCRIPT_ARGS = "script", "script_args"  # the study's names for the script and its args
#: what bench itself may set on any run, beyond ``parascale run``'s own options
_BENCH_SETS = ("threads", "save_model", "tensorboard")


def is_script(params: dict[str, Any]) -> bool:
    return params.get(SCRIPT) is not None


def argv_of(value: Any) -> list[str]:
    """``script_args`` as the script's argv: a string split as a shell would, or a list."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise UsageError(f"script_args {value!r}: {exc} (give the script's arguments as a "
                             "shell would take them, e.g. '--epochs 2 --batch-size 16')") from None
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def check_job(train: dict[str, Any], params: dict[str, Any]) -> Path:
    """The script of a study's run, checked with the options that run gives it; UsageError
    for a train option a script does not take, a missing script or a strategy it cannot run."""
    from parascale.script.options import refusal
    from parascale.script.launch import checked_script
    from parascale.script.options import taken

    runs = set(taken())
    foreign = sorted(set(train) - runs - set(_BENCH_SETS)) + \
        sorted(set(train.get("sync_options") or {}) - runs)  # an option parascale run lacks
    if foreign:
        name = foreign[0].replace("_", "-")
        raise UsageError(f"--{name} is the script's own business in a study of a script: pass "
                         f"it in its arguments (--script-args '--{name} ...'); parascale's "
                         f"options for a script are those of parascale run")
    script = checked_script(str(params[SCRIPT]))
    argv_of(params.get(SCRIPT_ARGS))
    if train.get("tensorboard"):  # train's preflight checks it; a script's run has none
        from parascale.files import check_writable_folder

        check_writable_folder(str(train["tensorboard"]), "--tensorboard")
    if (why := refusal(train.get("sync"))) is not None:
        raise UsageError(why)
    return script


def run_options(train: dict[str, Any]) -> dict[str, Any]:
    """The options of ``train`` that ``parascale run`` takes (a Slurm job's command line)."""
    from parascale.script.options import taken

    runs = set(taken())
    return {k: v for k, v in train.items() if k in runs}


def command_tail(params: dict[str, Any]) -> list[str]:
    """What follows a run's options on the ``parascale run`` command line: the script and its
    arguments ('--' first, so that none is taken for an option of run's); nothing for a train
    run."""
    if not is_script(params):
        return []
    argv = argv_of(params.get(SCRIPT_ARGS))
    return [str(params[SCRIPT]), *(["--", *argv] if argv else [])]


def run_job(config: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """One run of the study's script, as ``parascale run`` makes it, into ``config['out']``;
    its record (or a failure record)."""
    from parascale.script.launch import run

    return run(config, params[SCRIPT], argv_of(params.get(SCRIPT_ARGS)))
