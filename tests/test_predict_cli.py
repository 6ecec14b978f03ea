"""``parascale predict`` end to end in-process: from hand-made records with stated phase times to
the table and the files, and every bad input as one line with exit code 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import one_line_error, record, write_study
from parascale.cli.main import main
from parascale.predict import NAMES, Options, predict

COMPUTE, OPTIMIZER = 0.030, 0.002  # seconds per step at batch 32 on one worker
GRADIENT = 4_000_000  # bytes entering the allreduce


def run_record(workers: int, *, sync_s: float = 0.0, compute: float = COMPUTE, batch: int = 32,
               device: str = "cuda", throughput: float | None = None) -> dict:
    """A record whose steady phase means say compute, sync and optimizer in seconds."""
    step = compute + sync_s + OPTIMIZER
    rec = record(workers, throughput or workers * batch / step, batch=batch, step_p50=step)
    rec["steps"]["phases"].update({
        "compute": {"p50": compute, "p95": compute, "max": compute, "mean": compute},
        "data": {"p50": 0.0, "p95": 0.0, "max": 0.0, "mean": 0.0},
        "sync": {"p50": sync_s, "p95": sync_s, "max": sync_s, "mean": sync_s},
        "optimizer": {"p50": OPTIMIZER, "p95": OPTIMIZER, "max": OPTIMIZER, "mean": OPTIMIZER}})
    rec["steps"]["phases"]["step"].update(mean=step, p95=step)  # no spread: no wait
    rec["derived"]["bytes_per_step"] = int(2 * (workers - 1) / workers * GRADIENT)
    rec["derived"]["sync_options"] = {"bucket_mb": 25.0, "compression": "none"}
    rec["environment"]["device_type"] = device
    rec["environment"]["backend"] = "nccl" if device == "cuda" else "gloo"
    return rec


def comm_folder(folder: Path, alpha: float = 20e-6, beta: float = 1e-9,
                backend: str = "nccl") -> Path:
    rows = [{"op": "allreduce", "bytes": s, "time_s": 2 * alpha + s * beta}
            for s in (1 << 10, 1 << 20, 16 << 20)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "comm.json").write_text(json.dumps({
        "schema": "parascale.comm/1", "status": "ok", "world_size": 2,
        "environment": {"backend": backend, "hosts": ["h"]}, "results": rows}))
    return folder


def test_prediction_from_a_hand_made_record(tmp_path, capsys):
    study = write_study(tmp_path / "s", [run_record(1)])
    code = main(["predict", str(study), "--interconnect", "pcie", "--workers", "1,2,4",
                 "--params", "1M", "--scaling", "weak"])
    out = capsys.readouterr().out
    assert code == 0
    pred = predict(Options([str(study)], interconnect="pcie", workers=(1, 2, 4), params=1e6,
                           scaling="weak"))
    points = pred.curves["weak"]
    # by hand: ring on pcie for 4 MB in DDP's 2 buckets (1 MiB, then the rest), hidden behind
    # 2/3 of 30 ms of compute on a GPU
    alpha, beta = 10e-6, 1 / 15.75e9
    ring4 = 2 * (2 * 3 * alpha) + 2 * 3 / 4 * 4e6 * beta
    assert points[2].comm_s == pytest.approx(ring4)
    assert points[2].exposed_s == 0.0 and points[2].efficiency == pytest.approx(1.0)
    assert points[0].step_s == pytest.approx(COMPUTE + OPTIMIZER)
    # every input says how it is known; the given size and the assumed overlap say so
    how = {i.name: i.how for i in pred.model.inputs}
    assert how["gradient S"] == "given" and how["overlap φ"] == "assumed"
    assert how["compute(b)"] == "measured" and how["link"] == "assumed"
    assert "[assumed]" in out and "GB/s" in out and "PCIe 3.0" in out


def test_overlap_and_gradient_are_measured_when_a_two_worker_run_exists(tmp_path):
    # 2 workers exposed 1 ms of an exchange the fitted link puts at 2α + S·β = 4.04 ms
    study = write_study(tmp_path / "s", [run_record(1), run_record(2, sync_s=0.001)])
    pred = predict(Options([str(study)], comm=str(comm_folder(tmp_path / "c")),
                           workers=(1, 2)))
    how = {i.name: i for i in pred.model.inputs}
    assert how["gradient S"].how == "measured" and pred.model.gradient_bytes == GRADIENT
    assert how["overlap φ"].how == "measured"
    modelled = 2 * (2 * 20e-6) + GRADIENT * 1e-9  # 2 buckets, each paying 2α
    assert pred.model.overlap == pytest.approx((modelled - 0.001) / COMPUTE, rel=1e-3)
    # the study's 2-worker point is compared with the prediction at the same N
    (check,) = [c for c in pred.checks if c.workers == 2]
    assert check.predicted_efficiency == pytest.approx(pred.curves["weak"][1].efficiency)
    assert check.measured_efficiency == pytest.approx(
        (2 * 32 / (COMPUTE + 0.001 + OPTIMIZER)) / (2 * 32 / (COMPUTE + OPTIMIZER)))
    # the run used nccl like the comm record: no backend note
    assert not any("measured with" in n for n in pred.notes)


def test_an_exchange_longer_than_the_links_line_is_scaled_to_what_the_run_exposed(tmp_path):
    # 2 workers exposed 10 ms where the fitted link puts the exchange at 4.04 ms: nothing hid
    # (φ = 0); and their compute took 2 ms longer than one worker's (on CPUs the exchange's
    # threads share its cores): the step's exchange costs that much more than an allreduce
    study = write_study(tmp_path / "s", [run_record(1),
                                         run_record(2, sync_s=0.010, compute=COMPUTE + 0.002)])
    pred = predict(Options([str(study)], comm=str(comm_folder(tmp_path / "c")),
                           workers=(1, 2, 4)))
    how = {i.name: i for i in pred.model.inputs}
    assert pred.model.overlap == 0.0 and how["exchange scale"].how == "measured"
    modelled = 2 * (2 * 20e-6) + GRADIENT * 1e-9  # 2 buckets, each paying 2α
    assert pred.model.exchange_scale == pytest.approx(0.012 / modelled, rel=1e-3)
    # the prediction at the records' N is the measured step; at 4 the exchange scales alike
    two = next(p for p in pred.curves["weak"] if p.workers == 2)
    assert two.step_s == pytest.approx(COMPUTE + 0.002 + 0.010 + OPTIMIZER, rel=1e-3)
    assert pred.model.comm(4) == pytest.approx(
        pred.model.exchange_scale * (2 * (2 * 3 * 20e-6) + 1.5 * GRADIENT * 1e-9), rel=1e-3)
    # an exposed exchange shorter than the line's is φ's to explain: no scale
    quick = write_study(tmp_path / "q", [run_record(1), run_record(2, sync_s=0.001)])
    assert predict(Options([str(quick)], comm=str(comm_folder(tmp_path / "c")),
                           workers=(1, 2))).model.exchange_scale == 1.0


def test_cpu_records_assume_no_overlap_and_a_foreign_backend_is_said(tmp_path):
    study = write_study(tmp_path / "s", [run_record(1, device="cpu")])
    pred = predict(Options([str(study)], comm=str(comm_folder(tmp_path / "c", backend="nccl")),
                           workers=(1, 2), params=1e6))
    assert pred.model.overlap == 0.0
    assert any("measured with nccl, the runs with gloo" in n for n in pred.notes)
    assert not any("compete for its cores" in n for n in pred.notes)  # 2 of the 8 cores
    full = predict(Options([str(study)], interconnect="pcie", workers=(1, 2, 8, 16), params=1e6))
    assert any("from N = 8 on that one machine" in n for n in full.notes)


def test_compute_is_fitted_over_several_batches(tmp_path):
    records = [run_record(1, batch=32, compute=0.010), run_record(1, batch=64, compute=0.018)]
    records[1]["study"]["config_id"] += "-b64"
    study = write_study(tmp_path / "s", records)
    pred = predict(Options([str(study)], interconnect="nvlink", workers=(1, 2), params=1e6,
                           scaling="strong", global_batch=64))
    assert pred.model.work.per_sample_s == pytest.approx(0.008 / 32)
    assert pred.model.work.fixed_s == pytest.approx(0.002)
    assert {i.name: i.how for i in pred.model.inputs}["compute(b)"] == "fitted"
    assert pred.curves["strong"][1].work_s == pytest.approx(0.010 + OPTIMIZER)


def test_out_writes_three_files_atomically(tmp_path, capsys):
    study = write_study(tmp_path / "s", [run_record(1), run_record(2, sync_s=0.002)])
    out = tmp_path / "pred"
    code = main(["predict", str(study), "--interconnect", "ib100", "--workers", "1,2,4,64",
                 "--noise-scale", "500", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == sorted(NAMES.values())  # no temporary left
    data = json.loads((out / NAMES["json"]).read_text())
    assert data["schema"] == "parascale.prediction/1"
    assert [p["workers"] for p in data["curves"]["weak"]] == [1, 2, 4, 64]
    assert data["curves"]["weak"][3]["tta_speedup"] is not None
    assert {i["how"] for i in data["inputs"]} >= {"measured", "assumed"}
    assert (out / NAMES["csv"]).read_text().splitlines()[0].startswith("mode,workers,")
    assert (out / NAMES["png"]).read_bytes()[:4] == b"\x89PNG"


def test_a_plot_that_fails_writes_nothing(tmp_path, monkeypatch):
    from parascale.predict import plot, write

    study = write_study(tmp_path / "s", [run_record(1)])
    pred = predict(Options([str(study)], interconnect="pcie", workers=(1, 2), params=1e6))

    def broken(_):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(plot, "render", broken)
    with pytest.raises(RuntimeError):
        write(pred, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_hierarchical_with_one_node_equals_flat(tmp_path):
    study = write_study(tmp_path / "s", [run_record(1)])
    flat = predict(Options([str(study)], interconnect="nvlink", workers=(1, 2, 8), params=1e7,
                           scaling="weak"))
    nodes = predict(Options([str(study)], interconnect="25gbe", gpus_per_node=8,
                            intra_node="nvlink", workers=(1, 2, 8, 16), params=1e7,
                            scaling="weak"))
    assert [p.comm_s for p in nodes.curves["weak"][:3]] == \
        pytest.approx([p.comm_s for p in flat.curves["weak"]])
    # 2 nodes of 8: a ring of 8 inside (DDP's 3 buckets of 40 MB: 1 MiB, 25 MiB, the rest),
    # then a ring of the 2 nodes on S/8 over 25 GbE
    inside = 3 * 2 * 7 * 10e-6 + 2 * 7 / 8 * 4e7 / 300e9
    across = 3 * 2 * 1 * 30e-6 + 2 * 1 / 2 * 4e7 / 8 / 3.125e9
    assert nodes.curves["weak"][3].comm_s == pytest.approx(inside + across)


def refused(capsys, argv: list[str]) -> str:
    """The one line a refused command printed (exit code 2)."""
    assert main(argv) == 2
    return one_line_error(capsys)


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    study = write_study(tmp_path / "s", [run_record(1)])
    out = tmp_path / "out"
    base = ["predict", str(study), "--params", "1M", "--out", str(out)]
    error = refused(capsys, [*base, "--interconnect", "infiniband"])
    assert "unknown preset 'infiniband'" in error
    assert "nvlink, pcie, ib100, 25gbe, loopback" in error
    error = refused(capsys, [*base, "--interconnect", "pcie", "--workers", "0,3"])
    assert "--workers 0,3" in error and "positive" in error
    assert "not both" in refused(capsys, base)
    assert "unknown strategy" in refused(
        capsys, [*base, "--interconnect", "pcie", "--sync", "gossip"])
    assert "cannot read 'lots'" in refused(
        capsys, ["predict", str(study), "--interconnect", "pcie", "--params", "lots"])
    assert "no comm.json" in refused(capsys, [*base, "--comm", str(tmp_path)])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "comm.json").write_text('{"schema": "other"}')
    assert "not a parascale comm record" in refused(
        capsys, [*base, "--comm", str(tmp_path / "bad")])
    assert "does not exist" in refused(
        capsys, ["predict", str(tmp_path / "nothing"), "--interconnect", "pcie"])
    assert not out.exists()


def test_a_record_without_steady_step_times_says_what_is_missing(tmp_path, capsys):
    rec = run_record(1)
    del rec["steps"]["phases"]["compute"]
    study = write_study(tmp_path / "s", [rec])
    error = refused(capsys, ["predict", str(study), "--interconnect", "pcie",
                                    "--params", "1M"])
    assert "no steady step times" in error and "steps.phases.compute.mean" in error


def test_a_one_worker_record_of_an_unknown_model_asks_for_the_size(tmp_path, capsys):
    rec = run_record(1)
    rec["config"]["model"] = "mypkg.nets:tiny"  # cannot be built here to count
    study = write_study(tmp_path / "s", [rec])
    error = refused(capsys, ["predict", str(study), "--interconnect", "pcie"])
    assert "--params" in error and "--gradient-bytes" in error


def test_the_gradient_of_a_one_worker_run_is_counted_from_its_model(tmp_path):
    # smallcnn on digits: the 2-worker record of a real run said 605224 bytes per step
    study = write_study(tmp_path / "s", [run_record(1)])
    pred = predict(Options([str(study)], interconnect="loopback", workers=(1, 2)))
    assert pred.model.gradient_bytes == 605224
    assert {i.name: i.how for i in pred.model.inputs}["gradient S"] == "counted"


def test_a_noise_scale_recorded_by_training_is_measured(tmp_path):
    rec = run_record(1)
    rec["epochs"][-1]["noise_scale"] = 800.0  # the field training will record per epoch
    study = write_study(tmp_path / "s", [rec])
    pred = predict(Options([str(study)], interconnect="pcie", workers=(1, 4), params=1e6,
                           scaling="weak"))
    noise = {i.name: i for i in pred.model.inputs}["noise scale B_noise"]
    assert noise.how == "measured" and pred.model.noise_scale == 800.0
    assert pred.curves["weak"][1].steps_factor == pytest.approx((1 + 800 / 128) / (1 + 800 / 32))
    given = predict(Options([str(study)], interconnect="pcie", workers=(1, 4), params=1e6,
                            noise_scale=100.0))
    assert {i.name: i.how for i in given.model.inputs}["noise scale B_noise"] == "assumed"


def test_the_strategy_and_its_settings_come_from_the_records(tmp_path, capsys):
    ps = run_record(2, sync_s=0.004)
    ps["config"].update(sync="parameter-server", ps_servers=2)
    ps["study"]["config_id"] += "-ps"
    study = write_study(tmp_path / "s", [run_record(1), ps])
    # two strategies in the records: which one to predict must be said
    error = refused(capsys, ["predict", str(study), "--interconnect", "pcie"])
    assert "--sync" in error and "allreduce, parameter-server" in error
    pred = predict(Options([str(study)], interconnect="pcie", workers=(1, 8),
                           sync="parameter-server"))
    assert pred.model.strategy.servers == 2 and not pred.model.strategy.overlaps
    # the parameter server's bytes_per_step is S itself (run_record wrote the allreduce count)
    assert pred.model.gradient_bytes == ps["derived"]["bytes_per_step"]


def test_several_models_need_model(tmp_path, capsys):
    other = run_record(1)
    other["config"]["model"] = "lenet"
    other["study"]["config_id"] += "-lenet"
    study = write_study(tmp_path / "s", [run_record(1), other])
    error = refused(capsys, ["predict", str(study), "--interconnect", "pcie"])
    assert "--model" in error and "lenet" in error and "smallcnn" in error
    pred = predict(Options([str(study)], interconnect="pcie", workers=(1, 2), model="lenet"))
    assert pred.subject.startswith("lenet on digits")


def test_a_strong_study_without_one_worker_is_compared_relative_to_its_smallest_n(tmp_path):
    records = []
    for n in (2, 4):
        rec = run_record(n, batch=64 // n, compute=COMPUTE * (64 // n) / 32)
        rec["study"]["scaling"] = "strong"
        rec["derived"].update(global_batch=64)
        records.append(rec)
    study = write_study(tmp_path / "s", records)
    pred = predict(Options([str(study)], interconnect="nvlink", workers=(1, 2, 4), params=1e6))
    assert list(pred.curves) == ["strong"] and pred.curves["strong"][0].global_batch == 64
    (check,) = [c for c in pred.checks if c.workers == 4]
    assert check.reference_workers == 2
    x = {p.workers: p.throughput for p in pred.curves["strong"]}
    assert check.predicted_efficiency == pytest.approx(2 * x[4] / (4 * x[2]))


def test_a_single_run_is_scaled_strongly_at_its_own_global_batch(tmp_path):
    """One run of 2 workers at 32 a device trained with a global batch of 64: strong scaling
    keeps that batch, not the per-device 32."""
    rec = run_record(2)
    rec["study"] = None  # a train --out folder: no study, no scaling mode
    study = write_study(tmp_path / "s", [rec])
    pred = predict(Options([str(study)], interconnect="nvlink", workers=(1, 2, 4), params=1e6))
    assert {p.global_batch for p in pred.curves["strong"]} == {64}
    assert [p.per_device_batch for p in pred.curves["strong"]] == [64, 32, 16]
    assert {p.per_device_batch for p in pred.curves["weak"]} == {32}
