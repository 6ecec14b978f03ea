"""An epoch's record entry from every rank's figures: the trainer's loop and the script API
(``parascale run``) both end an epoch here, once per epoch, never per step."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from parascale.batch import Plan
from parascale.runrecord import SAMPLES, EpochEntry, Unit
from parascale.runtime import World
from parascale.training.observe.contention import epoch_load
from parascale.training.observe.measure import PHASES


def epoch_entry(epoch: int, steps: int, plan: Plan, times: tuple[float, float],
                loss_sum: torch.Tensor, world: World, rate: float, cpu: list[float],
                warmup: bool, rows: Sequence[list[float]] = (),
                unit: Unit = SAMPLES) -> EpochEntry:
    """Collective (one gather, none in a world of one): the entry of an epoch of ``steps``
    optimizer steps, before its evaluation.

    Train loss over every sample of the epoch on all ranks; wall time of the slowest rank
    and each rank's CPU time (``times``: this rank's); what else used the CPUs meanwhile
    (``cpu``: this rank's ``CpuWatch.end_epoch``); the mean step split over every rank's steps
    (``rows``: this rank's step rows of the epoch; every rank gives them, or none does).
    ``unit``: the task's, for the entry's per-token figures."""
    epoch_time, cpu_time = times
    samples = steps * plan.derived.global_batch
    # the step split and the loss ride in the gather the epoch makes anyway: one collective,
    # and none in a world of one (every figure is then this rank's own)
    sums = [sum(column) for column in zip(*rows)] if rows else [0.0] * (len(PHASES) + 1)
    figures = [epoch_time, cpu_time, len(rows), *sums, *cpu]
    if world.size == 1:
        loss_total = float(loss_sum)
        gathered = [figures]
    else:
        mine = torch.cat([loss_sum.reshape(1), torch.tensor(
            figures, dtype=torch.float64, device=loss_sum.device)])
        parts = [torch.zeros_like(mine) for _ in range(world.size)]
        dist.all_gather(parts, mine)
        rows_of = [part.tolist() for part in parts]
        loss_total = 0.0
        for row in rows_of:  # in rank order: the same sum on every rank
            loss_total += row[0]
        gathered = [row[1:] for row in rows_of]
    per_rank = [g[0] for g in gathered]
    first_cpu = 3 + len(sums)
    other, steal = epoch_load([g[first_cpu:] for g in gathered])
    counted = sum(g[2] for g in gathered)
    split = {part: sum(g[3 + i] for g in gathered) / counted
             for i, part in enumerate((*PHASES, "step"))} if counted else None
    wall = max(per_rank)
    return EpochEntry(
        epoch=epoch, warmup=warmup, steps=steps, partial=steps < plan.steps_per_epoch,
        wall_time_s=wall, wall_time_s_per_rank=per_rank,
        cpu_time_s_per_rank=[g[1] for g in gathered], samples=samples,
        throughput=samples / wall if wall > 0 else None,
        train_loss=loss_total / samples,  # finite: every step's loss was checked
        lr=rate, other_cores=other, steal_cores=steal, step_split_s=split, unit=unit)
