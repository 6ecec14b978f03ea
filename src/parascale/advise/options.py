"""What ``parascale advise`` is asked: the job (train's options, as a flat dict), the resources
(CPU workers here, or a cluster described), the goal (a target on a metric, or a budget), the
space's bounds, and figures given by hand. :func:`validate` checks all of it before anything
is measured, one line for the first thing wrong, without torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parascale.errors import UsageError
from parascale.predict import limits

#: what advise chooses, so a job may not fix it
DECIDED = frozenset({"workers", "gpus", "device", "backend", "threads", "accumulate", "sync",
                     "sync_options", "lr_scaling", "stop_at_target", "out", "save_model",
                     "oversubscribe", "device_memory", "noise_scale", "resume",
                     "checkpoint_every", "keep", "max_restarts", "profile", "port",
                     "tensorboard"})
LR_RULES = ("bounded", "linear", "sqrt", "none")
BUDGETS = ("samples", "tokens", "epochs")
MAX_VERIFY = 20


@dataclass
class Options:
    job: dict[str, Any]
    """train's options of the job, as ``parascale.train`` takes them: the reference
    configuration (its batch and learning rate) and the goal's target."""
    # resources: CPU workers on this machine, or a cluster
    workers: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    interconnect: str | None = None
    intra_node: str | None = None
    comm: str | None = None
    device_memory: float | None = None
    """Bytes one device holds (a cluster's GPU; here, each worker's budget)."""
    gpu: str | None = None
    peak_tflops: float | None = None
    mfu: float | None = None
    # the goal, when not a target: one budget, in its unit, at the reference batch
    budget: float | None = None
    budget_unit: str | None = None
    # the space
    strategies: tuple[str, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    max_accumulate: int = 8
    precisions: tuple[str, ...] | None = None
    lr_rule: str = "bounded"
    exact_only: bool = False
    """Search only the strategy variants whose steps the noise-scale model covers."""
    # figures given by hand, each saving a measurement
    records: tuple[str, ...] = ()
    noise_scale: float | None = None
    noise_scale_se: float | None = None
    steps_to_target: float | None = None
    params: float | None = None
    flops_per_sample: float | None = None
    activations_per_sample: float | None = None
    train_samples: int | None = None
    # measuring here
    probe_steps: int = 30
    pilot_epochs: int = 2
    remeasure: bool = False
    quiet_machine: float | None = None
    verify: int = 0
    out: str | None = None

    @property
    def cluster(self) -> bool:
        return self.nodes is not None or self.gpus_per_node is not None

    @property
    def devices(self) -> int:
        if self.cluster:
            return (self.nodes or 1) * (self.gpus_per_node or 1)
        from parascale.runtime.env import available_cores

        return self.workers or available_cores()


def _count(name: str, value: Any, low: int = 1) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not low <= value <= limits.MAX_COUNT):
        raise UsageError(f"--{name} must be a whole number from {low} to {limits.MAX_COUNT:,}, "
                         f"got {value}")


def _positive(name: str, value: Any, high: float) -> None:
    if value is not None and not (limits.within(value, 0, high) and value > 0):
        raise UsageError(f"--{name} must be a positive number up to {high:g}, got {value}")


def _resources(opts: Options) -> None:
    _count("workers", opts.workers)
    _count("nodes", opts.nodes)
    _count("gpus-per-node", opts.gpus_per_node)
    _positive("device-memory", opts.device_memory, limits.MAX_BYTES)
    _positive("peak-tflops", opts.peak_tflops, 1e9)
    if opts.mfu is not None and not (limits.within(opts.mfu, 0, 1) and opts.mfu > 0):
        raise UsageError(f"--mfu is a share of the device's peak, above 0 and at most 1, got "
                         f"{opts.mfu}")
    if not opts.cluster:
        cluster_only = [name for name, value in (
            ("--interconnect", opts.interconnect), ("--intra-node", opts.intra_node),
            ("--gpu", opts.gpu), ("--peak-tflops", opts.peak_tflops), ("--mfu", opts.mfu),
            ("--records", opts.records or None)) if value is not None]
        if cluster_only:
            raise UsageError(f"{cluster_only[0]} describes a cluster's devices or links: give "
                             "--nodes M and --gpus-per-node G with it (or leave it out to "
                             "advise for this machine's CPU workers)")
        from parascale.runtime.env import available_cores

        cores = available_cores()
        if opts.workers is not None and opts.workers > cores:
            raise UsageError(f"--workers {opts.workers}: this machine has {cores} cores, and "
                             "advise searches one worker per core at most here; for more "
                             "devices describe them (--nodes M --gpus-per-node G ...)")
        return
    if opts.workers is not None:
        raise UsageError("--workers N is this machine's CPU workers, --nodes and "
                         "--gpus-per-node describe a cluster: the two contradict each other; "
                         "give one")
    if opts.nodes is None or opts.gpus_per_node is None:
        raise UsageError("a cluster needs both --nodes M and --gpus-per-node G")
    if opts.interconnect is None:
        raise UsageError("a cluster needs --interconnect PRESET for the link between nodes "
                         "(the link inside a node: --intra-node PRESET or --comm DIR)")
    if opts.comm is not None and opts.intra_node is not None:
        raise UsageError("--comm and --intra-node both name the link inside a node; give one")
    if opts.device_memory is None:
        raise UsageError("a cluster needs --device-memory SIZE (e.g. 80GiB): what one of its "
                         "devices holds")
    if opts.gpu is None and opts.peak_tflops is None and not opts.records:
        raise UsageError("a cluster needs its devices' speed: --gpu NAME (its datasheet peak), "
                         "--peak-tflops T, or --records of a run on such a device")
    if opts.verify:
        raise UsageError("--verify runs the configurations here; a cluster described is not "
                         "here: leave --verify out")


def _goal(opts: Options, target: bool) -> None:
    if opts.budget is not None:
        if opts.budget_unit not in BUDGETS:
            raise UsageError(f"a budget is in {', '.join(BUDGETS)}, got {opts.budget_unit!r}")
        _positive(f"budget-{opts.budget_unit}", opts.budget, limits.MAX_SAMPLES)
        if target:
            raise UsageError("give a target (--target-metric M --target-value V, or "
                             "--target-accuracy) or a budget (--budget-samples, "
                             "--budget-tokens, --budget-epochs), not both")
        if opts.steps_to_target is not None:
            raise UsageError("--steps-to-target belongs to a target; a budget says how long "
                             "to train")
    elif not target:
        raise UsageError("give the goal: a target (--target-metric loss --target-value 1.9, or "
                         "--target-accuracy 0.9) or a budget (--budget-samples N, "
                         "--budget-tokens N or --budget-epochs E)")


def _given(opts: Options) -> None:
    _positive("noise-scale", opts.noise_scale, limits.MAX_SAMPLES)
    if opts.noise_scale_se is not None:
        if opts.noise_scale is None:
            raise UsageError("--noise-scale-se is the standard error of --noise-scale B: give "
                             "both")
        if not limits.within(opts.noise_scale_se, 0, limits.MAX_SAMPLES):
            raise UsageError(f"--noise-scale-se must be 0 or more samples, got "
                             f"{opts.noise_scale_se}")
    _positive("steps-to-target", opts.steps_to_target, limits.MAX_COUNT ** 2)
    _positive("params", opts.params, limits.MAX_BYTES / 4)
    _positive("flops-per-sample", opts.flops_per_sample, 1e21)
    if opts.activations_per_sample is not None and not limits.within(
            opts.activations_per_sample, 0, limits.MAX_BYTES):
        raise UsageError(f"--activations-per-sample must be 0 or more bytes, got "
                         f"{opts.activations_per_sample}")
    _count("train-samples", opts.train_samples)


def _space(opts: Options) -> None:
    from parascale import sync

    if opts.lr_rule not in LR_RULES:
        raise UsageError(f"--lr-rule must be one of {', '.join(LR_RULES)}, got {opts.lr_rule!r}")
    for name in opts.strategies or ():
        sync.check(name)
    if opts.strategies is not None and not opts.strategies:
        raise UsageError("--strategies needs at least one strategy, e.g. allreduce,zero")
    if opts.batch_sizes is not None:
        if not opts.batch_sizes or any(not 1 <= b <= limits.MAX_COUNT for b in opts.batch_sizes):
            raise UsageError("--batch-sizes are per-device batches from 1 up, e.g. 16,32,64")
    _count("max-accumulate", opts.max_accumulate)
    _count("probe-steps", opts.probe_steps, 5)
    _count("pilot-epochs", opts.pilot_epochs)
    _count("verify", opts.verify, 0)
    if opts.verify > MAX_VERIFY:
        raise UsageError(f"--verify runs the recommendation and the K next: K at most "
                         f"{MAX_VERIFY}, got {opts.verify}")
    if opts.quiet_machine is not None and not limits.within(opts.quiet_machine, 0, 1e6):
        raise UsageError(f"--quiet-machine waits at most MAX_S seconds, 0 or more, got "
                         f"{opts.quiet_machine}")
    from parascale.config import PRECISIONS

    bad = [p for p in opts.precisions or () if p not in PRECISIONS]
    if bad:
        raise UsageError(f"--precisions: unknown {bad[0]!r}; choose from {', '.join(PRECISIONS)}")
    if opts.precisions and not opts.cluster and set(opts.precisions) != {
            opts.job.get("precision", "fp32")}:
        raise UsageError("--precisions searches precisions on a cluster's GPUs (from their "
                         "peaks); here the job's own --precision is measured")


def validate(opts: Options) -> Any:
    """Every option and the job checked, before anything is read or measured; the job's
    checked configuration (a TrainConfig)."""
    from parascale.config import TrainConfig
    from parascale.validation import validate as validate_config

    given = sorted(set(opts.job) & DECIDED)
    if given:
        raise UsageError(f"{given[0]} is advise's to choose (it searches devices, batch, "
                         "accumulation, strategy and the learning-rate rule); leave it out "
                         "of the job")
    _resources(opts)
    cfg = TrainConfig.from_dict({**opts.job, "workers": 1})
    validate_config(cfg)
    flat = cfg.to_dict()
    target = flat.get("target_metric") is not None or flat.get("target_accuracy") is not None
    _goal(opts, target)
    _given(opts)
    _space(opts)
    if cfg.job.task is None:
        from parascale import tasks

        tasks.check_target(cfg)
    return cfg
