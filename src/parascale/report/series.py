"""Which runs make one series (one line on a plot, one table): equal in all but the worker count.

Runs of one study, model, dataset and scaling mode form a family. Inside it, a setting that
differs between runs (a learning rate, a sweep of batch sizes) splits the family into series,
each labelled with the values that tell it apart, so a sweep is never mistaken for repeats.
Settings that change along a series by design are not counted: the worker count, the batch that
scales with it (global under weak scaling, per-device under strong), and the knobs that do not
change what is measured (output folder, port, timeout, thread count, seed, ...).
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable

from parascale.report.load import RunRecord

ALONG_A_SERIES = {"workers", "gpus", "batch_size", "global_batch", "threads", "out", "port",
                  "timeout", "save_model", "eval_every", "eval_batches", "data_dir", "download", "seed", "sync",
                  "device", "backend", "model", "dataset", "oversubscribe", "verify_data",
                  "tensorboard"}


def variants(records: Iterable[RunRecord]) -> dict[int, str]:
    """``id(record)`` -> its series label within its family ('' when the family is one series)."""
    families: dict[tuple, list[RunRecord]] = defaultdict(list)
    for record in records:
        families[(record.study, record.model, record.dataset, record.scaling)].append(record)
    labels: dict[int, str] = {}
    for (_, _, _, scaling), members in families.items():
        settings = [_settings(r, scaling) for r in members]
        # a setting a record does not state is no difference: a strategy's options are in the
        # records of that strategy only (a baseline states none), older records lack newer ones
        differing = sorted({k for s in settings for k in s
                            if len({t[k] for t in settings if k in t}) > 1})
        for record, s in zip(members, settings):
            labels[id(record)] = ", ".join(_show(k, s[k]) for k in differing if k in s)
    return labels


def _settings(record: RunRecord, scaling: str | None) -> dict[str, str]:
    config = record.get("config", default={})
    found = {k: json.dumps(v, sort_keys=True) for k, v in config.items()
             if k not in ALONG_A_SERIES}
    # the batch a series holds fixed; without a recorded mode, weak (the per-device batch)
    fixed = "global_batch" if scaling == "strong" else "per_device_batch"
    found[fixed] = json.dumps(record.get("derived", fixed))
    return found


def _show(name: str, text: str | None) -> str:
    value = "-" if text is None else json.loads(text)
    if name == "per_device_batch":
        return f"batch {value} per device"
    if name == "global_batch":
        return f"global batch {value}"
    return f"{name}={value}"
