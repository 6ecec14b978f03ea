"""The report's sentences: no speedup without a reference, noise said as noise, a slowdown as
slower, and lost efficiency split into sharing the machine and gradient exchange."""

import csv
import io

import pytest

from conftest import record
from helpers import repeats, rows_of, with_ids
from parascale.report import format_terminal
from parascale.report.tables import format_csv
from parascale.report.wording import sentences


def test_one_configuration_shows_no_speedup_and_says_what_is_missing(tmp_path):
    rows = rows_of(tmp_path, [record(2, 400.0)])
    text = format_terminal(rows)
    assert "2.00×" not in text and "100.0%" not in text, text
    assert rows[0].speedup is None and rows[0].efficiency is None
    [sentence] = sentences(rows)
    assert "nothing to compare against" in sentence and "--workers 1,2" in sentence


def test_a_difference_inside_the_spread_is_within_noise(tmp_path):
    # the weak study: 2 workers ranged 317-481 samples/s
    rows = rows_of(tmp_path, with_ids(repeats(1, [410.0, 412.0, 415.0])
                                       + repeats(2, [317.0, 400.0, 481.0])))
    two = {r.workers: r for r in rows}[2]
    assert two.ratio == pytest.approx(400 / 412)
    assert two.ratio_range == pytest.approx((317 / 415, 481 / 410))  # [min/max, max/min]
    [sentence] = sentences(rows)
    assert "within noise" in sentence and "no speedup or slowdown is measurable" in sentence
    assert "0.76–1.17×" in sentence and "over 3 runs each" in sentence
    line = next(ln for ln in format_terminal(rows).splitlines() if ln.strip().startswith("2 "))
    assert "0.97× (0.76–1.17)~" in line


def test_one_run_per_configuration_takes_its_spread_from_its_steady_epochs(tmp_path):
    rows = rows_of(tmp_path, [record(1, 410.0, epoch_throughputs=[400.0, 410.0, 420.0]),
                              record(2, 430.0, epoch_throughputs=[380.0, 430.0, 450.0])])
    two = {r.workers: r for r in rows}[2]
    assert (two.spread.source, two.spread.n, two.spread.low, two.spread.high) == (
        "epochs", 3, 380.0, 450.0)
    assert two.ratio_range == pytest.approx((380 / 420, 450 / 400))
    assert "within noise" in sentences(rows)[0]
    assert "1 (3 ep)" in format_terminal(rows)


def test_a_slowdown_is_said_as_slower(tmp_path):
    rows = rows_of(tmp_path, with_ids(repeats(1, [490.0, 500.0, 510.0])
                                       + repeats(2, [290.0, 300.0, 310.0])))
    [sentence] = sentences(rows)
    assert "2 workers are slower than 1: 0.60× its throughput" in sentence, sentence
    assert "reach" not in sentence


def test_a_negative_sync_cost_inside_the_noise_is_not_measurable(tmp_path):
    records = repeats(1, [500.0, 505.0, 510.0]) + repeats(2, [380.0, 400.0, 420.0])
    records += repeats(2, [370.0, 396.0, 420.0], baseline=True, sync="none")
    rows = rows_of(tmp_path, with_ids(records))
    two = {r.workers: r for r in rows}[2]
    assert two.sync_cost == pytest.approx(1 - 400 / 396)  # -1%
    [sentence] = sentences(rows)
    assert "not measurable here" in sentence and "within noise" in sentence
    assert "costs -1%" not in sentence and "Gradient exchange costs" not in sentence
    assert "~" in next(ln for ln in format_terminal(rows).splitlines()
                       if ln.strip().startswith("2 ") and "%" in ln)


def test_lost_efficiency_is_split_into_sharing_and_exchange(tmp_path):
    # E = 1440/(2*1000) = 72%; baseline 1600: sharing 1 - 1600/2000 = 20 points, exchange
    # (1600 - 1440)/2000 = 8 points
    rows = rows_of(tmp_path, [record(1, 1000.0), record(2, 1440.0),
                              record(2, 1600.0, baseline=True, sync="none")])
    two = {r.workers: r for r in rows}[2]
    assert two.efficiency == pytest.approx(0.72)
    assert two.contention_loss == pytest.approx(0.20)
    assert two.exchange_loss == pytest.approx(0.08)
    [sentence] = sentences(rows)
    assert ("Of the 28% lost at N=2, 20 points is 2 processes sharing the machine, 8 points is "
            "gradient exchange.") in sentence, sentence
    text = format_terminal(rows)
    assert "1,600" in text and "20 pts" in text and "8 pts" in text  # the baseline's throughput
    [one, row] = list(csv.DictReader(io.StringIO(format_csv(rows))))
    assert float(row["contention_loss"]) == pytest.approx(0.20)
    assert float(row["exchange_loss"]) == pytest.approx(0.08)


def test_a_lost_share_inside_the_noise_says_so(tmp_path):
    records = repeats(1, [990.0, 1000.0, 1010.0]) + repeats(2, [1400.0, 1440.0, 1480.0])
    records += repeats(2, [1420.0, 1460.0, 1600.0], baseline=True, sync="none")
    rows = rows_of(tmp_path, with_ids(records))
    [sentence] = sentences(rows)
    assert "points is gradient exchange (within noise" in sentence, sentence
