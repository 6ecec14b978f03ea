"""The one rule for when a measured figure may become advice (parascale.precision)."""
from __future__ import annotations

import pytest

from parascale import precision


def test_four_steps_of_one_plus_minus_four_give_no_advice_and_say_how_many_steps():
    verdict = precision.judge(1.0, 4.0, 4)
    assert not verdict.precise and verdict.known
    # se falls like 1/sqrt(steps): 4 steps x (4 / 0.25)^2
    assert verdict.steps_needed == 4 * 16 ** 2
    text = verdict.reason("the gradient noise scale")
    assert "not measured precisely enough" in text and "about 1,024 steps" in text
    assert "400%" in text and "4 step(s)" in text


def test_a_wide_error_over_many_steps_is_refused_and_a_tight_one_is_not():
    demo = precision.judge(692.0, 326.0, 40)
    assert not demo.precise
    assert demo.steps_needed == pytest.approx(40 * (326 / 692 / 0.25) ** 2, abs=1)
    assert precision.judge(812.0, 61.0, 40).precise
    assert precision.judge(812.0, 61.0, None).precise  # steps unknown: the error decides


@pytest.mark.parametrize("relative, shown", [
    (0.2512, "25.1%"), (0.2504, "25.04%"), (0.26, "26%"), (4.0, "400%"), (0.2500001, "over 25%")])
def test_an_error_just_over_the_limit_is_shown_at_the_precision_that_tells_them_apart(
        relative, shown):
    """Not "standard error 25% of it ... needs at most 25%": the figure shows why it fails."""
    text = precision.judge(1000.0, 1000.0 * relative, 100).reason()
    assert f"standard error {shown} of it" in text and "at most 25%" in text, text


def test_a_handful_of_steps_is_too_few_even_with_a_small_error():
    few = precision.judge(800.0, 10.0, 5)
    assert not few.precise and few.steps_needed == precision.MIN_STEPS
    assert "20+ steps" in few.reason()


def test_nothing_known_cannot_be_judged_and_bad_figures_are_never_precise():
    unknown = precision.judge(800.0, None, None)
    assert not unknown.known and not unknown.precise
    assert not precision.judge(800.0, None, 50).precise  # no error to check over 50 steps
    for value in (0.0, -3.0, float("nan"), float("inf"), None):
        assert not precision.judge(value, 1.0, 100).precise
    assert not precision.judge(800.0, float("nan"), 100).precise


def test_the_rule_imports_no_torch():
    # the training loop, report and predict share it; report must stay light
    source = precision.__loader__.get_source(precision.__name__)
    assert "import torch" not in source
