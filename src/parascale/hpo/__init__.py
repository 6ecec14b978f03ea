"""Parallel hyperparameter search on Optuna: trials as processes on disjoint devices.

The modules: :mod:`.space` (what is searched), :mod:`.study` (the Optuna study in its database,
and trials a dead search left running), :mod:`.slots` (which devices each trial gets),
:mod:`.search` (the loop that starts trials and records their ends), :mod:`.trial` (the trial
process) and :mod:`.results` (the table,
the plots and the best trial's one test evaluation). Nothing here imports Optuna at import time:
the pruner a trial's rank 0 asks lives below, in :mod:`parascale.training.loop.pruning` (the
trainer must not import upwards), and a plain training run must not pay for Optuna either.
"""
