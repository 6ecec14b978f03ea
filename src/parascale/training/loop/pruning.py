"""A search's pruner inside a trial: after each evaluated epoch rank 0 reports the validation
accuracy to the Optuna study and asks whether to stop; every rank learns the answer.

The trial's workers talk to the study's storage themselves, as Optuna's distributed workers do:
the search process only starts trials and records their ends, so pruning costs no round trip
through it, and a trial on another machine needs nothing but the storage URL. The pruner is not
kept in the storage, so the search hands its description to the trial (``PARASCALE_PRUNER``).
Optuna is imported only in a trial, never by a plain training run. It lives in training/, not
hpo/, because the loop uses it: hpo imports it from here (the arrows point down).
"""
from __future__ import annotations

import json
import os
from typing import Any

from parascale.runrecord import EpochEntry
from parascale.runtime import contract

ENV = contract.PRUNER
PRUNERS = ("median", "halving", "none")


def make_pruner(kind: str):
    """Optuna's pruner for ``kind``: the median rule or asynchronous successive halving."""
    import optuna

    if kind == "median":  # below the median of earlier trials at the same epoch, from epoch 2
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2)
    if kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def intermediate(objective: str, value: float) -> float:
    """The value a pruner compares at each epoch, in the direction of the study: the
    metric's validation value, or for time-to-accuracy (minimised) the validation error."""
    return 1.0 - value if objective == "tta" else value


class TrialPruner:
    """A search trial's pruner: reports each evaluated epoch to the study and asks whether to
    stop the trial."""

    def __init__(self, spec: dict[str, Any], world):
        self.spec, self.world = spec, world
        self.number: int = spec["number"]
        self._trial: Any = None  # optuna.trial.Trial, made at the first question (optuna is
        # imported only in a trial)

    @classmethod
    def from_env(cls, world) -> TrialPruner | None:
        text = os.environ.get(ENV)
        return cls(json.loads(text), world) if text else None

    def stop(self, entry: EpochEntry, last: bool = False) -> bool:
        """Whether the search prunes the trial after this epoch (collective: every rank calls).
        After the ``last`` epoch the value is reported but the pruner is not asked: a trial
        that trained every epoch is complete, with its objective, never pruned."""
        import torch
        import torch.distributed as dist

        accuracy = entry.metrics.get(f"val_{self.spec.get('metric', 'accuracy')}")
        if accuracy is None:  # not an evaluated epoch: nothing to judge
            return False
        if last:  # every rank knows it: nothing to broadcast
            if self.world.is_main:
                self._ask(entry.epoch, accuracy, ask=False)
            return False
        verdict = torch.zeros(1, device=self.world.device)
        if self.world.is_main:
            verdict[0] = float(self._ask(entry.epoch, accuracy))
        if self.world.size > 1:
            dist.broadcast(verdict, 0)
        return bool(verdict.item())

    def _ask(self, epoch: int, accuracy: float, ask: bool = True) -> bool:
        if self._trial is None:
            import optuna

            # the one opener of a study's file, with the search's other storage rules (its
            # lock); imported at call time, so only a trial's rank 0 reaches up for it
            from parascale.studydb import open_storage

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study = optuna.load_study(study_name=self.spec["study"],
                                      storage=open_storage(self.spec["storage"]),
                                      pruner=make_pruner(self.spec["pruner"]))
            self._trial = optuna.trial.Trial(study, self.spec["trial_id"])
        self._trial.report(intermediate(self.spec["objective"], accuracy), epoch)
        return ask and self._trial.should_prune()
