"""The combination matrix (issue 32): every strategy the registry holds x optimizer x job x
precision x entry, and what each combination must do, from the strategies' own declarations.

Nothing here names a strategy. A case is refused when the strategy's traits or its own
``refuse`` say so (``script_refusal`` for ``parascale run``, ``optimizer`` for any other
optimizer than its own, ``Strategy.refuse`` for the configuration); every other case trains,
and passes the foundation test (2 workers with B/2 each end with the parameters of 1 worker
with B) when ``Strategy.equivalence`` says it must: ``GRADIENT`` under any optimizer,
``UPDATE`` under one whose update is linear in the gradient. A strategy registered later joins
the matrix with the cases its declarations give it.

Each case is small on purpose (2 workers, 3 steps of a tiny model): the matrix looks for
combinations that fail, not for how well they train.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parascale import sync
from parascale.config import TrainConfig

TESTS = Path(__file__).resolve().parent
EXAMPLES = TESTS.parent / "examples"
SCRIPT = TESTS / "matrix_jobs.py"

ENTRIES = ("train", "run")
OPTIMIZERS = ("sgd", "adamw", "own")
JOBS = ("digits", "regression", "gpt")
PRECISIONS = ("fp32", "bf16")  # bf16: CPU autocast has it, so every device here allows it

#: whether each optimizer's update is linear in the gradient (``sync.UPDATE`` needs it); "own"
#: is the task's or script's own, tests/matrix_jobs.py's ``own_optimizer`` (RMSprop)
LINEAR = {"sgd": True, "adamw": False, "own": False}
#: learning rates that keep 3 steps of each optimizer well inside float range
LR = {"sgd": 0.1, "adamw": 0.01, "own": 0.001}
WORKERS = 2
STEPS = 3
#: per-device batch on 2 workers; the reference, 1 worker, takes twice as much
BATCH = {"digits": 8, "regression": 8, "gpt": 4}
TIMEOUT_S = 30.0  # a collective that waits longer fails the case

#: each job's options under ``train``, with ``--optimizer sgd|adamw`` and with its own optimizer
_BUILT_IN = {
    "digits": {"model": "mlp", "dataset": "digits"},
    "regression": {"task": "regression:task"},
    # the held-out tenth of the corpus is 30,000 windows: 1 in 2,000 training windows instead
    "gpt": {"model": "gpt", "dataset": "shakespeare", "context": 16, "gpt_layers": 1,
            "gpt_width": 32, "gpt_heads": 2, "evaluate_test": False, "val_fraction": 0.0005},
}
_OWN = {job: {"task": f"matrix_jobs:{job}"} for job in JOBS}


@dataclass(frozen=True)
class Expected:
    """What the case must do: be refused (``refusal``: the words the one line must hold), or
    train, and with ``foundation`` end where one worker with the whole batch does."""

    refusal: str | None
    foundation: bool = False

    @property
    def outcome(self) -> str:
        if self.refusal is not None:
            return "refused"
        return "trained+foundation" if self.foundation else "trained"


@dataclass(frozen=True)
class Case:
    strategy: str
    entry: str
    optimizer: str
    job: str
    precision: str

    @property
    def id(self) -> str:
        return "-".join((self.entry, self.strategy, self.optimizer, self.job, self.precision))

    def options(self, workers: int = WORKERS) -> dict[str, Any]:
        """The TrainConfig fields of this case on ``workers`` workers (the reference: 1)."""
        if self.entry == "run":
            return {"sync": self.strategy, "workers": workers, "timeout": TIMEOUT_S}
        job = _OWN[self.job] if self.optimizer == "own" else _BUILT_IN[self.job]
        chosen = {} if self.optimizer == "own" else {"optimizer": self.optimizer}
        return {**job, **chosen, "sync": self.strategy, "workers": workers,
                "batch_size": BATCH[self.job] * WORKERS // workers, "steps": STEPS,
                "lr": LR[self.optimizer], "momentum": 0.9, "weight_decay": 1e-4, "seed": 3,
                "precision": self.precision, "timeout": TIMEOUT_S,
                # the device's peak is measured per run otherwise; no case reads utilisation
                "peak_tflops": 1.0}

    def config(self, workers: int = WORKERS) -> TrainConfig:
        return TrainConfig.from_dict(self.options(workers))

    def argv(self, workers: int = WORKERS) -> list[str]:
        """The script's arguments (``run``)."""
        return ["--job", self.job, "--optimizer", self.optimizer, "--precision", self.precision,
                "--batch-size", str(BATCH[self.job] * WORKERS // workers),
                "--steps", str(STEPS), "--lr", str(LR[self.optimizer])]

    def reference(self) -> Case:
        """The case whose one worker with the whole batch this one is compared with: the
        default strategy's (one worker exchanges nothing, whatever the strategy)."""
        return Case(sync.DEFAULT, self.entry, self.optimizer, self.job, self.precision)

    def expected(self) -> Expected:
        cls = sync.get(self.strategy)
        traits = cls.traits
        if self.entry == "run" and traits.script_refusal is not None:
            return Expected(traits.script_refusal)
        # a script always steps its own optimizer
        mine = "own" if self.entry == "run" else self.optimizer
        if traits.optimizer not in (None, mine):
            return Expected(traits.optimizer_why)
        cfg = self.config()
        sync.settle(cfg)
        refusal = cls.refuse(cfg)
        if refusal is not None:
            return Expected(refusal)
        equivalence = cls.equivalence(cls.settings_of(cfg))
        return Expected(None, equivalence == sync.GRADIENT or (
            equivalence == sync.UPDATE and LINEAR[self.optimizer]))


def cases() -> list[Case]:
    """Every combination, in the registry's order of strategies."""
    return [Case(strategy, entry, optimizer, job, precision)
            for strategy in sync.names() for entry in ENTRIES for optimizer in OPTIMIZERS
            for job in JOBS for precision in PRECISIONS]
