"""The options ``parascale run`` takes, which the command line, a study of a script and a
Slurm job of one all need: kept here, below all three."""
from __future__ import annotations

from parascale import sync
from parascale.errors import UsageError

#: the TrainConfig fields ``parascale run`` takes: where to run, how to synchronise, how to end,
#: where to write; the rest (model, data, batch, optimizer) is the script's own business
FIELDS = ("workers", "gpus", "device", "backend", "threads", "oversubscribe", "device_memory",
          "sync", "sync_options", "target_accuracy", "target_metric", "target_value", "port",
          "timeout", "out", "tensorboard")


def taken() -> list[str]:
    """The settings ``run`` takes: :data:`FIELDS`, and the options of the strategies that can
    run a script (as the registry says)."""
    scripted = set(sync.with_trait(script_refusal=None))
    return [*FIELDS, *(name for name, (_, owners) in sync.options().items()
                       if scripted & set(owners))]


def refusal(name: str | None) -> str | None:
    """One line when ``--sync name`` cannot run a script, else None (the strategy's traits
    say; None is the default strategy)."""
    able = sync.with_trait(script_refusal=None)
    try:
        name = sync.check(name or sync.DEFAULT)
    except UsageError:
        return f"unknown --sync {name!r}: a script runs under {', '.join(able)}"
    why = sync.traits_of(name).script_refusal
    if why is None:
        return None
    return f"--sync {name} cannot run a script: {why}; choose one of {', '.join(able)}"
