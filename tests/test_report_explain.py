"""The report's "Explaining the runs": each run's gradient noise scale (the record's ``noise``
section) and links to its traces (``profile``), in the terminal summary and on the page."""
from __future__ import annotations

import pytest

from parascale.report import load_studies, summary_rows, terminal_summary
from parascale.report.html import render_html
from conftest import record, write_study


def page(folder):
    """The report page as write_report makes it for STUDY/report (its plots left out)."""
    loaded = load_studies([folder])
    return render_html(loaded, summary_rows(loaded.records), [], (), folder / "report")


def noise(value, batch, se=None, epoch=3, reason=None):
    return {"measured": reason is None, "reason": reason, "per_device_batch": batch // 2,
            "global_batch": batch, "noise_scale": value, "noise_scale_se": se, "epoch": epoch,
            "advice": None if value is None else f"batches beyond about {value:,.0f} give "
                                                 "diminishing returns for this model now"}


@pytest.fixture
def study(tmp_path):
    one, two, four = record(1, 100.0), record(2, 180.0), record(4, 300.0)
    one["noise"] = noise(None, 32, reason="one worker has one batch size")
    two["noise"] = noise(812.4, 64, se=61.0)
    four["noise"] = noise(1234.0, 128, se=None)
    two["profile"] = {"steps": [10, 12], "traces": ["traces/rank-0.json", "traces/rank-1.json"],
                      "complete": True, "note": None}
    # a record is input: a name that is not one --profile writes is never linked
    four["profile"] = {"steps": [1, 2], "traces": ["javascript:alert(1)", "/etc/passwd",
                                                   "traces/../../x.json", "traces/rank-1.json"],
                       "note": "<b>x</b>"}
    return write_study(tmp_path / "study", [one, two, four])


def test_the_terminal_says_each_runs_noise_scale_and_the_largest_batchs_advice(study):
    text = " ".join(terminal_summary(load_studies([study])).split())
    assert "Gradient noise scale of smallcnn on digits" in text
    assert "at global batch 64: 812 ± 61 (epoch 3)" in text
    assert "at global batch 128: 1,234 (epoch 3)" in text
    assert text.index("batch 64:") < text.index("batch 128:")
    assert "By the last: batches beyond about 1,234 give diminishing returns" in text


def test_the_page_tables_the_noise_scale_and_links_the_traces_relative_to_it(study):
    text = page(study)
    section = text[text.index("<h2>Explaining the runs</h2>"):]
    assert "812 ± 61 (epoch 3)" in section
    assert "one worker has one batch size" in section  # a run without it says why
    # STUDY/report/report.html -> STUDY/runs/<config>/traces/rank-R.json
    two = load_studies([study]).records[1]
    for rank in (0, 1):
        assert f'<a href="../runs/{two.config_id}/traces/rank-{rank}.json">rank {rank}</a>' \
            in section
    # a link is named by the rank in its file name, not by its place in the list
    four = load_studies([study]).records[2]
    assert f'<a href="../runs/{four.config_id}/traces/rank-1.json">rank 1</a>' in section
    assert "javascript:" not in section and "/etc/passwd" not in section
    assert "../../x.json" not in section
    assert "&lt;b&gt;x&lt;/b&gt;" in section and "<b>x</b>" not in section


def test_records_without_either_say_so_and_nothing_else(tmp_path):
    folder = write_study(tmp_path / "old", [record(1, 100.0), record(2, 190.0)])
    assert "noise scale" not in terminal_summary(load_studies([folder]))
    text = page(folder)
    assert "No run recorded a gradient noise scale." in text
    assert "No run was profiled" in text


def with_steps(rec, steps):
    """The record's last epoch, the one its noise section names, measured over ``steps``."""
    rec["epochs"][-1]["noise_steps"] = steps
    return rec


def test_an_imprecise_noise_scale_gives_no_advice_and_says_how_many_steps(tmp_path):
    # vgg16, four steps on 2 workers: 1 ± 4; the demo: 692 ± 326 over 40 steps
    tiny, wide = record(2, 180.0), record(4, 300.0)
    tiny["noise"], wide["noise"] = noise(1.0, 64, se=4.0), noise(692.0, 128, se=326.0)
    folder = write_study(tmp_path / "s", [with_steps(tiny, 4), with_steps(wide, 40)])
    text = " ".join(terminal_summary(load_studies([folder])).split())
    assert "692 ± 326 (epoch 3)" in text  # the figure is still shown
    assert "diminishing returns" not in text
    assert "By the last: the noise scale was not measured precisely enough" in text
    assert "about 143 steps would make it so" in text
    section = page(folder)
    section = section[section.index("<h2>Explaining the runs</h2>"):]
    assert "diminishing returns" not in section and "about 1,024 steps" in section


def test_a_precise_noise_scale_keeps_its_advice(tmp_path):
    two = record(2, 180.0)
    two["noise"] = noise(812.4, 64, se=61.0)
    folder = write_study(tmp_path / "s", [with_steps(two, 40)])
    text = " ".join(terminal_summary(load_studies([folder])).split())
    assert "By the last: batches beyond about 812 give diminishing returns" in text
    assert "precisely" not in text
