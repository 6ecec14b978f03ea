"""FLOPs counted by torch's counter, the devices' peaks, and the utilisation arithmetic."""
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from parascale import flops
from parascale.models.gpt import GPT
from parascale.tasks.builtin import cross_entropy as _loss


def test_a_linear_layer_costs_its_forward_and_its_weights_gradient():
    model = nn.Linear(8, 4, bias=False)
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    # the forward and the weight's gradient, 2 * 5 * 8 * 4 FLOPs each; the data needs none
    assert flops.count_step(model, (x, y), _loss) == 2 * 2 * 5 * 8 * 4


def test_counting_leaves_the_model_and_the_random_state_as_they_were():
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 3))
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    flops.count_step(model, (x, y), _loss)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_cpu_attention_kernel_is_counted_with_torchs_own_formula():
    model = GPT(vocab=13, context=16, layers=2, heads=2, width=32)
    x = torch.randint(0, 13, (3, 16))
    with FlopCounterMode(display=False) as plain:  # torch alone misses the CPU kernel
        nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    counted = flops.count_step(model, (x, x), _loss)
    q = (3, 2, 16, 16)  # batch, heads, tokens, width per head
    forward = flops.flop_counter.sdpa_flop_count(q, q, q)
    backward = flops.flop_counter.sdpa_backward_flop_count(q, q, q, q)
    assert counted - plain.get_total_flops() == 2 * (forward + backward)


def test_known_gpus_have_a_sourced_peak_per_precision():
    peak, source = flops.gpu_peak("NVIDIA H100 PCIe", "bf16")
    assert peak == 756e12 and "datasheet" in source
    assert flops.gpu_peak("NVIDIA H100 80GB HBM3", "bf16")[0] == 989e12
    assert flops.gpu_peak("NVIDIA A100-SXM4-40GB", "fp32")[0] == 19.5e12
    assert flops.gpu_peak("Tesla K80", "fp32") is None


def test_a_given_peak_wins_and_a_cpu_peak_is_measured():
    given = flops.peak(torch.device("cpu"), "fp32", 2.5)
    assert given == {"peak_flops": 2.5e12, "peak_source": "--peak-tflops",
                     "peak_measured": False}
    measured = flops.peak(torch.device("cpu"), "fp32", None)
    assert measured["peak_measured"] and measured["peak_flops"] > 0
    assert measured["peak_source"].startswith("measured")


def test_utilisation_is_achieved_model_flops_over_the_summed_peaks():
    devices = [{"peak_flops": 100.0, "peak_source": "s", "peak_measured": True}] * 2
    # 10 FLOPs per micro-batch per device, 2 devices x 2 micro-batches; 40 samples/s of 8 a step
    section = flops.section(10, devices, world=2, accumulate=2, steady_throughput=40.0,
                            global_batch=8)
    assert section["flops_per_step"] == 40
    assert section["achieved_flops"] == 40 * 5
    assert section["mfu"] == 200 / 200
    unknown = [{"peak_flops": None, "peak_source": "unknown GPU", "peak_measured": False}]
    assert flops.section(10, unknown, 1, 1, 8.0, 8)["mfu"] is None


def test_the_report_shows_the_utilisation_and_the_csv_its_figures(tmp_path):
    import csv
    import io

    from conftest import record, write_study

    from parascale.report import load_records, summary_rows
    from parascale.report.tables import format_csv, format_markdown

    runs = [record(1, 100.0), record(2, 180.0)]
    for run, mfu in zip(runs, (0.25, 0.225), strict=True):
        run["summary"].update(flops_per_step=4e9, mfu=mfu)
        run["flops"] = {"peak_measured": True}
    rows = summary_rows(load_records([write_study(tmp_path / "study", runs)]).records)
    text = format_markdown(rows)
    assert "MFU" in text
    assert "25.0% (measured peak)" in text and "22.5% (measured peak)" in text
    table = list(csv.DictReader(io.StringIO(format_csv(rows))))
    assert [float(r["mfu"]) for r in table] == [0.25, 0.225]
    assert table[0]["flops_per_step"] == "4000000000.0" and table[0]["mfu_peak_measured"] == "1"


def test_a_study_without_flops_has_no_utilisation_column(tmp_path):
    from conftest import record, write_study

    from parascale.report import load_records, summary_rows
    from parascale.report.tables import format_markdown

    rows = summary_rows(load_records([write_study(tmp_path / "s", [record(1, 100.0)])]).records)
    assert "MFU" not in format_markdown(rows)


def test_predict_shows_the_utilisation_of_each_predicted_point(tmp_path, capsys):
    from conftest import record, write_study

    from parascale.cli.main import main
    from parascale.predict import Options, predict

    step = 0.032
    rec = record(1, 32 / step, batch=32, step_p50=step)
    rec["steps"]["phases"].update({name: {"p50": s, "p95": s, "max": s, "mean": s} for name, s in
                                   (("compute", 0.030), ("data", 0.0), ("sync", 0.0),
                                    ("optimizer", 0.002))})
    rec["steps"]["phases"]["step"].update(mean=step, p95=step)
    rec["summary"]["flops_per_step"] = 32 * 1e9  # 1 GFLOP a sample
    rec["flops"] = {"peak_flops": 100e12, "peak_source": "measured: a matmul",
                    "peak_measured": True}
    study = write_study(tmp_path / "s", [rec])
    pred = predict(Options([str(study)], interconnect="pcie", workers=(1, 2), params=1e6,
                           scaling="weak"))
    assert pred.flops == {"per_sample": 1e9, "peak": 100e12, "source": "measured: a matmul",
                          "measured": True}
    one = pred.curves["weak"][0]
    assert one.throughput * 1e9 / 100e12 == pytest.approx(0.01)  # 1,000 samples/s: 1 TFLOP/s
    assert main(["predict", str(study), "--interconnect", "pcie", "--workers", "1,2",
                 "--params", "1M", "--scaling", "weak"]) == 0
    out = capsys.readouterr().out
    assert "MFU" in out and "1.0%" in out and "device peak = 1e+14 FLOP/s  [measured]" in out


def test_predict_counts_the_gpts_gradient_from_its_recorded_sizes():
    from conftest import record
    from parascale.predict.gradient import counted
    from parascale.report.load import RunRecord

    rec = record(1, 100.0, model="gpt", dataset="shakespeare")
    rec["config"].update(context=16, gpt_layers=2, gpt_heads=2, gpt_width=32)
    size, how = counted(RunRecord(Path("r.json"), "study", rec))
    model = GPT(vocab=89, context=16, layers=2, heads=2, width=32)
    assert size == 4 * sum(p.numel() for p in model.parameters())
    assert "parameters of gpt counted" in how


class _Seen(nn.Linear):
    """A layer that notes what kind of weight its forward was given."""

    seen: list = []

    def forward(self, x):
        type(self).seen.append(type(self.weight.data).__name__)
        return super().forward(x)


def test_the_count_runs_on_fake_tensors_not_a_copy_of_the_weights():
    _Seen.seen = []
    model = _Seen(8, 4)
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    assert flops.count_step(model, (x, y), _loss) == 2 * 2 * 5 * 8 * 4  # the bias is free
    assert _Seen.seen == ["FakeTensor"]


def test_a_loss_that_needs_real_values_is_counted_on_a_real_copy():
    def real_loss(model, batch):
        out = _loss(model, batch)
        return out * (1.0 if out.item() > -1 else 2.0)  # .item(): fake tensors have no value

    _Seen.seen = []
    model = _Seen(8, 4)
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    assert flops.count_step(model, (x, y), real_loss) >= 2 * 2 * 5 * 8 * 4
    assert _Seen.seen[-1] == "Tensor"
