"""A task's records in the report: throughput in its unit, the column of the metric that judges
it, a target headed with its direction; records of image tasks without a task section read as
they always did."""
import pytest

from parascale.cli.main import main
from parascale.report import format_terminal, load_records, load_studies, summary_rows
from parascale.report.tables import format_csv

from conftest import one_line_error, record, write_study


def tokens_record(n: int, throughput: float) -> dict:
    r = record(n, throughput, batch=8)
    r["config"].update(task="lm:task", model="smallcnn", dataset="digits")
    r["task"] = {"name": "lm", "unit": "tokens", "units_per_sample": 128.0, "judge": "loss",
                 "metrics": [{"name": "loss", "higher_is_better": False}]}
    r["summary"]["final_metrics"] = {"test_loss": 1.5 + n / 100}
    r["time_to_accuracy"] = {"target": 1.9, "metric": "loss", "higher_is_better": False,
                             "reached": True, "split": "test", "epoch": 2, "elapsed_s": 10.0 / n}
    return r


def test_a_tokens_task_reads_in_tokens_per_second_judged_by_its_loss(tmp_path):
    folder = write_study(tmp_path / "study", [tokens_record(1, 100.0), tokens_record(2, 180.0)])
    rows = summary_rows(load_records([folder]).records)
    text = format_terminal(rows)
    assert "tokens/s" in text and "samples/s" not in text
    assert "23,040" in text  # 180 samples/s x 128 tokens per sample
    assert "test loss" in text and "1.52" in text and "time to loss ≤ 1.9" in text
    assert "lm:task on its own data" in text
    csv_text = format_csv(rows)
    assert "unit,units_per_sample,judge,judge_value,tta_metric" in csv_text.splitlines()[0]
    assert ",tokens,128.0,loss,1.52,loss" in csv_text.splitlines()[2]


def test_a_task_record_names_no_built_in_model_and_reads_as_its_task(tmp_path, capsys):
    """A task's record leaves the built-in model and data options null (they did not run);
    report and predict name the task instead, and do not refuse the record for it."""
    records = [tokens_record(n, 100.0 * n) for n in (1, 2)]
    for r in records:
        r["config"].update(model=None, dataset=None, num_classes=None)
        r["study"]["config_id"] = f"lm-n{r['derived']['world_size']}"
        r["derived"]["bytes_per_step"] = 4000 * (r["derived"]["world_size"] - 1)
        r["steps"]["phases"] = {name: {"p50": 0.03, "p95": 0.03, "max": 0.03, "mean": 0.03}
                                for name in ("step", "compute")}
    folder = write_study(tmp_path / "study", records)
    assert main(["report", str(folder), "--out", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    assert "lm:task on its own data" in text and "smallcnn" not in text
    assert main(["predict", str(folder), "--interconnect", "pcie", "--workers", "1,4"]) == 0
    text = capsys.readouterr().out
    assert "lm:task" in text and "smallcnn" not in text


def test_a_tokens_tasks_sentences_speak_its_unit_as_its_tables_do(tmp_path, capsys):
    """One unit throughout, the task's: the sentence under the table said samples/s where the
    table said tokens/s."""
    lone = tokens_record(2, 116.0)
    lone["study"]["scaling"] = None  # the formula's note names the unit too
    study = write_study(tmp_path / "study", [lone])
    assert main(["report", str(study), "--out", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    assert "only 2 workers measured (14,848 tokens/s)" in text  # 116 x 128
    assert "samples/s" not in text


def test_an_image_record_without_a_task_section_reads_as_before(tmp_path):
    records = [record(1, 100.0), record(2, 190.0)]
    assert all("task" not in r for r in records)
    rows = summary_rows(load_records([write_study(tmp_path / "study", records)]).records)
    text = format_terminal(rows)
    assert "samples/s" in text and "test acc" in text
    assert [(r.unit, r.units_per_sample, r.judge) for r in rows] == [("samples", 1.0,
                                                                      "accuracy")] * 2


def test_report_recomputes_time_to_target_on_any_metric_in_its_direction(tmp_path):
    # the test loss falls 1.0, 0.5, 0.33 over three epochs: at most 0.5 first at epoch 2
    rec = record(2, 1000.0)
    folder = write_study(tmp_path / "study", [rec])
    loaded = load_studies([folder], ("loss", 0.5))
    tta = loaded.ok[0].data["time_to_accuracy"]
    assert (tta["metric"], tta["higher_is_better"], tta["reached"], tta["epoch"]) == \
        ("loss", False, True, 2)
    assert tta["elapsed_s"] == rec["epochs"][1]["elapsed_s"] and tta["best"] == pytest.approx(1 / 3)
    assert main(["report", str(folder), "--target-metric", "loss", "--target-value", "0.5",
                 "--out", str(tmp_path / "r")]) == 0
    assert "time to loss ≤ 0.5" in (tmp_path / "r" / "summary.md").read_text()


def test_report_reads_a_tasks_own_metric_on_the_validation_curve(tmp_path):
    rec = record(1, 100.0)
    rec["task"] = {"name": "reg", "unit": "samples", "units_per_sample": 1.0, "judge": "mae",
                   "metrics": [{"name": "loss", "higher_is_better": False},
                               {"name": "mae", "higher_is_better": False}]}
    for e, value in zip(rec["epochs"], [0.9, 0.25, 0.2]):
        e["val_mae"] = value
    loaded = load_studies([write_study(tmp_path / "study", [rec])], ("mae", 0.3))
    tta = loaded.ok[0].data["time_to_accuracy"]
    assert (tta["split"], tta["epoch"], tta["higher_is_better"]) == ("validation", 2, False)


@pytest.mark.parametrize("args, words", [
    (["--target-metric", "mae", "--target-value", "0.3"], "'mae'"),
    (["--target-metric", "loss"], "go together"),
    (["--target", "0.9", "--target-metric", "loss", "--target-value", "1"], "not both"),
])
def test_report_refuses_a_target_the_records_cannot_answer_in_one_line(tmp_path, capsys, args,
                                                                       words):
    folder = write_study(tmp_path / "study", [record(1, 100.0)])
    assert main(["report", str(folder), *args, "--out", str(tmp_path / "r")]) == 2
    line = one_line_error(capsys)
    assert words in line and not (tmp_path / "r").exists()
    if words == "'mae'":
        assert "recorded: accuracy, loss" in line


def test_a_target_on_another_metric_is_not_drawn_on_the_accuracy_axis(tmp_path):
    from parascale.report.plots import _target

    folder = write_study(tmp_path / "study", [record(1, 100.0), record(2, 190.0)])
    loss_rows = summary_rows(load_studies([folder], ("loss", 0.5)).records)
    assert {r.tta_metric for r in loss_rows} == {"loss"} and _target(loss_rows) is None
    assert _target(summary_rows(load_studies([folder], 0.8).records)) == 0.8
