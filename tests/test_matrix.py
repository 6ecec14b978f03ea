"""The combination matrix's fast tier (issue 32): every combination of strategy, optimizer, job,
precision and entry (tests/matrix_cases.py, generated from the registry), checked as
``parascale train`` and ``parascale run`` check it before any worker starts. A combination the
strategy's declarations refuse is refused by the entry, in one line that says why, with nothing
written; every other one passes every check (tests/test_matrix_processes.py then trains it).
"""
from __future__ import annotations

import pytest

import parascale
from matrix_cases import EXAMPLES, SCRIPT, WORKERS, Case, cases
from parascale import sync
from parascale.errors import UsageError
from parascale.script import launch
from parascale.training.launch.preflight import plan_checked
from parascale.validation import validate
from toy_strategy import Toy

MEMO: dict = {}  # the checks' memo across cases, as a study's: each model probed once


@pytest.fixture(scope="module", autouse=True)
def examples_on_path():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))  # where the regression task is found
        yield


def check(case: Case, out: str | None = None) -> None:
    """The checks of the case's entry: ``train``'s without its launch when ``out`` is None (it
    would start workers), else ``parascale.train`` itself (which must refuse before starting
    any); ``run``'s checks, or ``parascale.script.launch.run`` itself."""
    if case.entry == "train":
        if out is None:
            cfg = case.config()
            validate(cfg)
            plan_checked(cfg, WORKERS, MEMO)
        else:
            parascale.train({**case.options(), "out": out})
    elif out is None:
        launch.checked(case.options())
    else:
        launch.run({**case.options(), "out": out}, SCRIPT, case.argv())


@pytest.mark.parametrize("case", cases(), ids=lambda case: case.id)
def test_each_combination_is_refused_in_one_line_or_passes_every_check(case, tmp_path):
    expected = case.expected()
    if expected.refusal is None:
        check(case)
        return
    out = tmp_path / "out"
    with pytest.raises(UsageError) as refused:
        check(case, str(out))
    line = str(refused.value)
    assert "\n" not in line and expected.refusal in line, line
    assert not out.exists()


@pytest.fixture
def toy():
    sync.register(Toy)
    yield
    sync.unregister(Toy.name)


def test_a_registered_strategy_joins_the_matrix_with_what_it_declares(toy):
    mine = [case for case in cases() if case.strategy == Toy.name]
    assert len(mine) == len(cases()) // len(sync.names())
    # it declares no refusal and the mean gradient: every case of it trains and must end as one
    # worker with the whole batch does, run's included
    assert {case.expected().outcome for case in mine} == {"trained+foundation"}
    for case in mine[::7]:
        check(case)

