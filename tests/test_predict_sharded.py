"""predict for the sharded strategies: each stage's exchange (ring passes of the bytes), the
bytes a record counted inverted back to S, the stage read from the records, and the memory
peak with FSDP's transients and its model built shard by shard."""
from __future__ import annotations

import pytest
from torch import nn

from conftest import record, write_study
from parascale.predict import costs, gradient
from parascale.predict.forecast import Options, predict
from parascale.predict.interconnect import preset
from parascale.predict.memory import (PerParameter, largest_unit, peak, per_device, startup,
                                      transient)
from parascale.predict.model import Model, Work
from parascale.report.load import load_records

LINK = preset("ib100")


@pytest.mark.parametrize("n", [2, 8])
def test_each_stage_moves_its_ring_passes(n):
    ring = costs.exchange_time(costs.strategy("allreduce"), n, 1e8, LINK)
    fsdp2, fsdp3, zero = (costs.strategy("fsdp", {"stage": 2}), costs.strategy("fsdp", {"stage": 3}),
                          costs.strategy("zero"))
    # stage 2: an all-gather and a reduce-scatter, allreduce's bytes; stage 3 gathers again
    assert costs.exchange_time(fsdp2, n, 1e8, LINK) == pytest.approx(ring)
    assert costs.exchange_time(fsdp3, n, 1e8, LINK) == pytest.approx(1.5 * ring)
    # torch's ZeRO-1: DDP's allreduce, then the updated parameters broadcast (one pass more)
    assert costs.exchange_time(zero, n, 1e8, LINK) == pytest.approx(1.5 * ring)


def test_zeros_broadcast_never_hides_behind_backward():
    work = Work(per_sample_s=1.0, fixed_s=0.0, other_s=0.0)  # compute dwarfs the exchange
    exposed = {name: Model(work, 1e8, costs.strategy(name), LINK, overlap=1.0)
               .point("weak", 4, 32, 32).exposed_s for name in ("allreduce", "zero", "fsdp")}
    assert exposed["allreduce"] == exposed["fsdp"] == 0
    assert exposed["zero"] == pytest.approx(costs.exchange_time(costs.strategy("zero"), 4, 1e8,
                                                                LINK) / 3)


@pytest.mark.parametrize("sync, stage, passes", [("zero", None, 3), ("fsdp", 2, 2),
                                                 ("fsdp", 3, 3)])
def test_a_records_bytes_invert_to_the_gradient(tmp_path, sync, stage, passes):
    size, n = 4e6, 2
    rec = record(n, 1000.0, sync=sync)
    # as the strategies count them (sync/zero.py, sync/fsdp.py)
    rec["derived"]["bytes_per_step"] = int(passes * (n - 1) / n * size)
    if stage is not None:
        rec["derived"]["sync_options"] = {"stage": stage}
    [loaded] = load_records([write_study(tmp_path / "s", [rec])]).records
    assert gradient.from_record(loaded)[0] == pytest.approx(size)


def phased(rec: dict) -> dict:
    """``rec`` with the phase means predict calibrates from (30 ms of compute a step)."""
    rec["steps"]["phases"].update({name: {"p50": t, "p95": t, "max": t, "mean": t} for name, t in
                                   (("compute", 0.03), ("data", 0.0), ("sync", 0.0),
                                    ("optimizer", 0.002))})
    return rec


def test_the_stage_comes_from_the_records(tmp_path):
    one = phased(record(1, 1000.0))
    two = phased(record(2, 1800.0, sync="fsdp"))
    two["derived"]["sync_options"] = {"stage": 2}
    folder = write_study(tmp_path / "s", [one, two])
    pred = predict(Options([str(folder)], interconnect="ib100", sync="fsdp", workers=(1, 2)))
    assert pred.model.strategy.stage == 2 and pred.model.strategy.passes == 2
    assert "ZeRO stage 2" in pred.model.strategy.describe()


def test_fsdps_peak_adds_its_transients_and_its_model_is_built_shard_by_shard():
    b = PerParameter(4, 4, 4, "fp32 SGD with momentum")
    psi, unit, largest = 50e6, 4e6, 4e6
    # stage 3 on 2: the step's 6 bytes per parameter plus two units gathered and one unit's
    # gradients with their reduce-scatter buffer; evaluation gathers a unit at a time too
    step3 = per_device(3, psi, 2, b) + 2 * 4 * unit + 2 * 4 * unit
    assert peak(3, psi, 2, b, 0, unit, largest) == step3
    # built without storage: its shards, and the largest tensor whole as it is replayed
    assert startup(3, psi, 2, b, largest) == 4 * psi / 2 + 4 * largest < step3
    # a strategy that keeps the parameters whole builds the model whole; so does one worker
    assert startup(0, psi, 2, b) == startup(1, psi, 2, b) == startup(3, psi, 1, b) == 4 * psi
    assert peak(1, psi, 2, PerParameter(4, 4, 0, "no state"), 0) == 8 * psi
    heavy = PerParameter(64, 4, 4, "large parameters, small state")  # the start-up decides
    assert peak(3, psi, 8, heavy, 0, unit, 40e6) == startup(3, psi, 8, heavy, 40e6) > \
        per_device(3, psi, 8, heavy) + transient(3, heavy, unit)
    # stage 2 holds the parameters whole in the step: its peak is the step's plus the gradients'
    assert peak(2, psi, 2, b, 0, unit) == per_device(2, psi, 2, b) + 2 * 4 * unit
    assert peak(0, psi, 2, b) == peak(0, psi, 1, b) == per_device(0, psi, 1, b)


def test_the_largest_unit_is_counted_on_the_model_built_here(tmp_path):
    from parascale import models

    def unit_of(**options) -> int | None:
        folder = write_study(tmp_path / str(len(list(tmp_path.iterdir()))),
                             [record(2, 1.0, **options)])
        return largest_unit(load_records([folder]).records[0])

    # the mlp's layers sit in one Sequential, its only child: one unit, the whole model
    mlp = models.build("mlp", 10, (1, 8, 8))
    assert unit_of(model="mlp") == sum(p.numel() for p in mlp.parameters())
    # the GPT's blocks are a ModuleList: a unit each, the embeddings and head another
    gpt = models.build("gpt", 89, (64,))
    block = sum(p.numel() for p in next(m for m in gpt.modules()
                                        if isinstance(m, nn.ModuleList))[0].parameters())
    assert block <= unit_of(model="gpt", dataset="shakespeare") < \
        sum(p.numel() for p in gpt.parameters()) / 2
    assert unit_of(model="no.such:model") is None


def test_device_memory_from_a_record_prints_fsdps_peaks(tmp_path, capsys):
    from parascale.cli.main import main

    rec = record(2, 1000.0, sync="fsdp", model="mlp")
    psi = 50_000_000  # the split's (a model of its size would be slow to build)
    whole = {"parameter_count": psi, "parameters_bytes": 4 * psi, "gradients_bytes": 4 * psi,
             "optimizer_state_bytes": 4 * psi, "activations_bytes": 0, "rest_bytes": 1}
    shard = {k: v // 2 if k.endswith("_bytes") else v for k, v in whole.items()}
    rec["memory"] = {"kind": "cpu_max_rss", "peak_bytes_per_rank": [1, 1],
                     "split_per_rank": [shard, shard]}
    folder = write_study(tmp_path / "s", [rec])
    assert main(["predict", str(folder), "--device-memory", "1", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "as parascale runs fsdp (largest unit 26,122 parameters" in out
    b = PerParameter(4, 4, 4, "")
    line = next(li for li in out.splitlines() if li.split()[:1] == ["2"] and len(li.split()) == 3)
    assert [float(v) for v in line.split()[1:]] == [
        round(peak(s, psi, 2, b, 0, 26122, 16384) / 2**30, 2) for s in (2, 3)] == [0.37, 0.28]
