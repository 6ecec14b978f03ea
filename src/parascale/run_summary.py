"""What a finished run says, wherever it ran (``train`` here, ``slurm train`` on a cluster): its
summary lines, a warning when other programs competed for the CPUs, the folder it goes to by
default, and when its command began (what the record's timing counts from)."""
from __future__ import annotations

import datetime
import os
import time
from pathlib import Path


def process_start() -> float:
    """When this process started, as a ``time.time()`` value. psutil's ``create_time`` adds a
    boot time that Linux gives in whole seconds (measured 0.28 s off here); the process's age
    on the boot-time clock is exact to a clock tick."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        import psutil

        return psutil.Process().create_time()


def default_out(cfg: dict) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if cfg.get("task"):  # package.module:function -> module-function
        module, _, function = str(cfg["task"]).partition(":")
        name = f"{module.rpartition('.')[2]}-{function}"
        if name.replace("-", "").replace("_", "").isalnum():
            return f"runs/{name}-{stamp}"
    return f"runs/{cfg.get('model', 'smallcnn')}-{cfg.get('dataset', 'digits')}-{stamp}"


def done_lines(record: dict) -> list[str]:
    """The command's wall time beside the training time, and where the steady figures are from."""
    summary, timing = record["summary"], record.get("timing")
    if timing:
        took = (f"done in {timing['command_s']:.1f} s (start-up {timing['startup_s']:.1f} s, "
                f"training {timing['training_s']:.1f} s)")
    else:  # under torchrun/srun the launcher's start is not ours to know
        took = f"done: training {summary['total_time_s']:.1f} s"
    task = record.get("task") or {}
    per, unit = task.get("units_per_sample", 1), task.get("unit", "samples")
    lines = [f"{took}: steady epoch {summary['steady_epoch_time_s']:.3f} s, "
             f"{summary['steady_throughput'] * per:,.0f} {unit}/s{judged(record)}"]
    how = "" if summary["steady_epoch_time_method"] == "epochs" else \
        (f"; no full epoch after the warm-up, so the epoch time is the mean step time x "
         f"{record['derived']['steps_per_epoch']} steps")
    lines.append(f"  steady figures from {summary['steady_source']}{how}")
    return lines + flops_lines(record)


def judged(record: dict) -> str:
    """', test accuracy 93.00%': the last evaluation of the metric that judges the run (the
    validation split's without a test evaluation); nothing when neither was evaluated."""
    task = record.get("task") if isinstance(record.get("task"), dict) else {}
    judge = task.get("judge") or "accuracy"
    summary = record.get("summary") or {}
    final = summary.get("final_metrics") or {}
    if judge == "accuracy" and "final_metrics" not in summary:  # a record from before tasks
        final = {"test_accuracy": summary.get("final_test_accuracy")}
    for split, said in (("test", "test"), ("val", "validation")):
        value = final.get(f"{split}_{judge}")
        if isinstance(value, (int, float)):
            shown = f"{value:.2%}" if judge == "accuracy" else f"{value:.4f}"
            return f", {said} {judge} {shown}"
    return ""


def flops_lines(record: dict) -> list[str]:
    """A token model's loss per token and perplexity; the FLOPs per step and the utilisation."""
    from parascale.flops import short

    summary, lines = record["summary"], []
    if summary.get("final_test_perplexity") is not None:  # tokens/s: the line above says it
        lines.append(f"  test loss {summary['final_test_loss']:.4f} nats/token, perplexity "
                     f"{summary['final_test_perplexity']:.2f}")
    counted = record.get("flops") or {}
    if counted.get("flops_per_step"):
        line = f"  {short(counted['flops_per_step'])} per step (torch's FLOP counter)"
        if counted.get("achieved_flops"):
            line += f", {short(counted['achieved_flops'])}/s"
        if counted.get("mfu") is not None:
            peak = "measured peak" if counted["peak_measured"] else "peak"
            line += f": {counted['mfu']:.1%} of the devices' {peak} " \
                    f"({short(counted['peak_flops'])}/s)"
        lines.append(line)
    return lines


def busy_warning(machine: dict | None) -> str | None:
    """One line when other programs competed for the CPUs while the run trained."""
    from parascale.runtime.machine import others_text

    if not machine or not machine["busy"]:
        return None
    host = max(machine["hosts"], key=lambda h: h["other_cores"] + h["steal_cores"])
    where = f" on {host['host']}" if len(machine["hosts"]) > 1 else ""
    load = f"other processes used {host['other_cores']:.2f} of {host['cores']} cores"
    if host["steal_cores"] >= 0.01:
        load += f" and the hypervisor took {host['steal_cores']:.2f}"
    return (f"parascale: warning: the CPUs were busy while this run trained{where}: {load} "
            f"on average; {others_text(host)}; its times are slower than a quiet machine's")
