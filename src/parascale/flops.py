"""A model's FLOPs per step, counted by torch, and the device's peak: model-FLOPs utilisation.

The FLOPs of one forward and backward pass are counted once per run, before training, on one
training batch by ``torch.utils.flop_counter.FlopCounterMode`` (never a formula typed by hand),
on a copy of the model so that nothing of the run changes (BatchNorm statistics, gradients,
random state). The optimizer's arithmetic is not model FLOPs and is not counted, as in
torchtitan and Lightning's ``ThroughputMonitor``: utilisation = achieved model FLOP/s / peak.

The peak of one device, in the run's precision: ``--peak-tflops`` when given; a GPU of the
table below (dense figures from the vendor's datasheet, no sparsity); on a CPU, measured by a
timed matrix multiply on the worker's own threads (the best of a few), and marked as measured.
"""
from __future__ import annotations

import copy
import math
import time

import torch
# torch's own fake tensors, as its FLOP counter's users count models too large to build
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import flop_counter

COUNTER = "torch.utils.flop_counter.FlopCounterMode"

# torch's counter knows the CUDA attention kernels; the CPU's fused kernel takes the same
# shapes first, so torch's own formulas for them apply (they count the full T x T scores even
# when causal, as torch does on the GPU)
def _as_registered(formula):
    """torch's formula as its own registry holds it: already reading shapes from tensors."""
    def raw(*args, out_val=None, **kwargs):
        return formula(*args, out_val=out_val, **kwargs)

    raw._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode: do not wrap it again
    return raw


_aten = torch.ops.aten
_CPU_ATTENTION = {
    _aten._scaled_dot_product_flash_attention_for_cpu:
        _as_registered(flop_counter.flop_registry[_aten._scaled_dot_product_flash_attention]),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward:
        _as_registered(flop_counter.flop_registry[
            _aten._scaled_dot_product_flash_attention_backward]),
}

# Dense peak TFLOP/s per GPU: (substring of torch.cuda.get_device_name, fp32, bf16/fp16 tensor
# cores, source). Longer names first: "H100 PCIe" before "H100".
_NVIDIA = "NVIDIA datasheet, dense (without sparsity)"
GPU_PEAKS: tuple[tuple[str, float, float, str], ...] = (
    ("H100 PCIe", 51.0, 756.0, f"{_NVIDIA}: H100 PCIe"),
    ("H100 NVL", 60.0, 835.0, f"{_NVIDIA}: H100 NVL"),
    ("H100", 67.0, 989.0, f"{_NVIDIA}: H100 SXM"),
    ("H200", 67.0, 989.0, f"{_NVIDIA}: H200 SXM"),
    ("GH200", 67.0, 989.0, f"{_NVIDIA}: GH200"),
    ("B200", 80.0, 2250.0, f"{_NVIDIA}: HGX B200, per GPU"),
    ("A100", 19.5, 312.0, f"{_NVIDIA}: A100 (SXM and PCIe)"),
    ("A10G", 31.2, 125.0, "NVIDIA A10 datasheet, dense; A10G taken as A10"),
    ("A10", 31.2, 125.0, f"{_NVIDIA}: A10"),
    ("L40S", 91.6, 362.0, f"{_NVIDIA}: L40S"),
    ("L4", 30.3, 121.0, f"{_NVIDIA}: L4"),
    ("V100", 15.7, 125.0, "NVIDIA V100 datasheet (SXM2); fp16 tensor cores, no bf16"),
    ("T4", 8.1, 65.0, "NVIDIA T4 datasheet; fp16 tensor cores, no bf16"),
    ("RTX 4090", 82.6, 165.2, "NVIDIA Ada architecture whitepaper: RTX 4090, fp16 with fp32 "
                              "accumulate, dense"),
    ("RTX 3090", 35.6, 71.0, "NVIDIA Ampere GA102 whitepaper: RTX 3090, fp16 with fp32 "
                             "accumulate, dense"),
)

# The side of the timed square matrices, and how many are timed. Small and many: on a machine
# other jobs share, the best of 30 multiplies of 512 (2.5 ms each) found 105 GFLOP/s on one
# core, near its FMA peak, where the best of 5 of 1024 (20 ms, longer than a time slice) found 27
CPU_MATMUL = 512
CPU_REPEATS = 30


def count_step(model: torch.nn.Module, batch, loss) -> int:
    """FLOPs of one forward and backward pass of ``model`` on ``batch``; ``loss(model,
    batch)`` is the task's loss. Counted on a twin made of fake tensors (torch's FakeTensorMode:
    each has its real tensor's shape, dtype and device, so the same kernels are chosen and
    counted, but no storage): a real copy was the largest moment of a sharded run's memory, a
    whole model more than a rank holds. A model built without storage (on the meta device) is
    counted as if on the batch's device. A model or loss that needs real values (``.item()``,
    a branch on the data) is counted on a real copy instead (not one without storage)."""
    mode = FakeTensorMode()
    device = next((t.device for t in _leaves(batch)), torch.device("cpu"))

    def convert(t: torch.Tensor) -> torch.Tensor:
        if not t.is_meta:
            return mode.from_tensor(t)
        with mode:  # a model built without storage (models/deferred.py): on the batch's device
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)

    try:
        twin = _twin(model, convert)
        fake = _tensors(batch, mode.from_tensor)
        with mode:
            return _count(twin, fake, loss)
    except Exception:  # noqa: BLE001 - whatever fake tensors cannot do, a real copy can
        if any(p.is_meta for p in model.parameters()):
            raise
        return _count(copy.deepcopy(model), batch, loss)


def _twin(model: torch.nn.Module, convert) -> torch.nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are ``convert``'s: each is put
    in deepcopy's memo, so that the copy takes the converted tensor and copies no storage."""
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(convert(p.detach()), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = convert(b)
    return copy.deepcopy(model, memo)


def _leaves(batch):
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            yield from _leaves(b)
    elif isinstance(batch, dict):
        for b in batch.values():
            yield from _leaves(b)


def _tensors(batch, convert):
    if isinstance(batch, torch.Tensor):
        return convert(batch)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_tensors(b, convert) for b in batch)
    if isinstance(batch, dict):
        return {k: _tensors(v, convert) for k, v in batch.items()}
    return batch


def _count(twin: torch.nn.Module, batch, loss) -> int:
    cuda = [p.device for p in twin.parameters() if p.device.type == "cuda"][:1]
    with torch.random.fork_rng(devices=cuda), \
            flop_counter.FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION) as counter:
        loss(twin, batch).backward()
    return int(counter.get_total_flops())


def gpu_peak(name: str, precision: str) -> tuple[float, str] | None:
    """(peak FLOP/s, source) of a GPU named ``name`` in ``precision``, or None if unknown."""
    for key, fp32, half, source in GPU_PEAKS:
        if key.lower() in name.lower():
            tflops = fp32 if precision == "fp32" else half
            return tflops * 1e12, f"{source} ({'fp32' if precision == 'fp32' else 'bf16/fp16'})"
    return None


def cpu_peak(precision: str, repeats: int = CPU_REPEATS) -> float:
    """FLOP/s of the best of ``repeats`` square matrix multiplies on this process's threads."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(CPU_MATMUL, CPU_MATMUL, generator=torch.Generator().manual_seed(0)).to(dtype)
    b = a.t().contiguous()
    a @ b  # warm-up: the BLAS's buffers and threads
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * CPU_MATMUL ** 3 / best


def peak(device: torch.device, precision: str, given_tflops: float | None) -> dict:
    """One device's peak: ``{"peak_flops", "peak_source", "peak_measured"}`` (None when
    unknown). A CPU's is measured here, so every rank must call this at the same moment."""
    if given_tflops is not None:
        return {"peak_flops": given_tflops * 1e12, "peak_source": "--peak-tflops",
                "peak_measured": False}
    if device.type == "cuda":
        found = gpu_peak(torch.cuda.get_device_name(device), precision)
        if found is None:
            return {"peak_flops": None, "peak_source": "unknown GPU: give --peak-tflops",
                    "peak_measured": False}
        return {"peak_flops": found[0], "peak_source": found[1], "peak_measured": False}
    return {"peak_flops": cpu_peak(precision),
            "peak_source": f"measured: {CPU_MATMUL}x{CPU_MATMUL} matrix multiply on "
                           f"{torch.get_num_threads()} thread(s), best of {CPU_REPEATS}",
            "peak_measured": True}


def measure(cfg, world, per_device_batch: int, split, model: torch.nn.Module, loss) -> dict:
    """Collective, before training: this rank counts the model's FLOPs on its first training
    batch's size and measures its device's peak; every rank's peak is gathered.
    ``{"per_device": FLOPs of one micro-batch or None, "devices": [peak per rank], "error"}``."""
    import torch.distributed as dist

    per_device, error = None, None
    try:
        batch = next(iter(split.batches([torch.arange(per_device_batch)], world.device,
                                        train=False)))
        # torch.compile's wrapper: the counter follows the eager module's operations
        per_device = count_step(getattr(model, "_orig_mod", model), batch, loss)
    except Exception as exc:  # noqa: BLE001 - a model the counter cannot follow still trains
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    mine = peak(world.device, cfg.strategy.precision, cfg.measure.peak_tflops)
    devices: list[dict] = [{}] * world.size
    dist.all_gather_object(devices, mine)
    return {"per_device": per_device, "devices": devices, "error": error}


def section(per_device_flops: int | None, devices: list[dict], world: int, accumulate: int,
            steady_throughput: float | None, global_batch: int) -> dict:
    """The record's ``flops`` section: the model's FLOPs per optimizer step (all devices),
    the achieved FLOP/s over the steady steps, and the utilisation of the devices' summed peak.
    ``devices``: every rank's :func:`peak`."""
    if per_device_flops is None:
        return {"counted_by": COUNTER, "flops_per_step": None, "achieved_flops": None,
                "mfu": None, "peak_flops": None, "peak_source": None, "peak_measured": None}
    per_step = per_device_flops * world * accumulate
    steps_per_s = steady_throughput / global_batch if steady_throughput else None
    achieved = per_step * steps_per_s if steps_per_s else None
    peaks = [d["peak_flops"] for d in devices]
    total_peak = sum(peaks) if all(p for p in peaks) else None
    return {"counted_by": COUNTER, "flops_per_step": per_step,
            "flops_per_sample": per_step / global_batch, "achieved_flops": achieved,
            "peak_flops": total_peak,
            "peak_flops_per_rank": peaks, "peak_source": devices[0]["peak_source"],
            "peak_measured": devices[0]["peak_measured"],
            "mfu": achieved / total_peak if achieved and total_peak else None}


def short(flops: float) -> str:
    """3.68 GFLOP style: FLOPs (or FLOP/s with a unit appended by the caller), 3 figures."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(flops) >= scale:
            return f"{flops / scale:.3g} {unit}FLOP"
    return f"{flops:.3g} FLOP"
