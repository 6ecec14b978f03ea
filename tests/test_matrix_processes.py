"""The combination matrix's process tier (issue 32): every combination the strategies accept
(tests/matrix_cases.py) trains for real on 2 workers, through the entry's own worker code, real
collectives and the real loop; those whose strategy says so end with the parameters of 1 worker
with the whole batch. The processes are shared across cases (tests/matrix_world.py), the worlds
are not: each case joins, builds and leaves its own.

Tolerances (docs/design.md, "The combination matrix (issue 32)", has the figures): fp32 within
``assert_same`` (sums in another order). bf16 rounds every matmul's gradient to 8 bits of
mantissa, and under AdamW and RMSprop an element whose half-batch gradients nearly cancel can
change sign and move 2 x lr, so no one bound per element separates a synchronised run from an
unsynchronised one: bf16 is held to distance, 2 workers ending at most ``BF16_SHARE`` as far
from 1 x B as the same 2 workers without an exchange (the baseline) do.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import assert_same
from matrix_cases import EXAMPLES, SCRIPT, Case, cases
from matrix_world import Result, Run, SharedWorld
from parascale import sync
from parascale.runtime import contract
from parascale.script import launch
from parascale.training.launch.preflight import plan_checked
from parascale.validation import validate

pytestmark = pytest.mark.slow  # the cases run on processes of their own

TRAINED = [case for case in cases() if case.expected().refusal is None]
BF16_SHARE = 0.25  # of the baseline's distance from 1 x B


class Results:
    """Each run's result, run once: a case on processes 0 and 1, and at the same time on
    process 2 the reference it is compared with (1 worker, the whole batch), if still to run."""

    def __init__(self, world: SharedWorld, folder):
        self.world, self.folder = world, folder
        self.done: dict[tuple[Case, int], Result] = {}
        self.memo: dict = {}  # the checks' memo, as a study's

    def prepare(self, case: Case, workers: int, processes: tuple[int, ...] = (0, 1)) -> Run:
        """The launcher's part: the checks and the plan, before anything starts."""
        out = self.folder / f"{case.id}-{workers}"
        if case.entry == "run":
            cfg, _ = launch.checked(case.options(workers))
            return Run(cfg, out, processes, script=str(SCRIPT), argv=case.argv(workers))
        cfg = case.config(workers)
        validate(cfg)
        return Run(cfg, out, processes, plan=plan_checked(cfg, workers, self.memo))

    def of(self, case: Case, workers: int = 2) -> Result:
        if (case, workers) not in self.done:
            wanted = [(case, workers)]
            if workers == 2 and (case.reference(), 1) not in self.done:
                wanted.append((case.reference(), 1))
            runs = [self.prepare(c, w, (0, 1) if w == 2 else (2,)) for c, w in wanted]
            self.done.update(zip(wanted, self.world.run(runs)))
        return self.done[(case, workers)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))  # the regression task, here and in the processes
        world = SharedWorld(3, folder)
        try:
            yield Results(world, folder)
        finally:
            world.close()


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b))


def check_record(case: Case, result: Result) -> None:
    record = result.record
    assert record["status"] == "ok" and record["config"]["sync"] == case.strategy
    assert record["derived"]["world_size"] == 2
    assert sum(epoch["steps"] for epoch in record["epochs"]) == 3
    assert math.isfinite(record["summary"]["final_train_loss"])
    if case.entry == "train":
        assert record["config"]["precision"] == case.precision
        evaluated = [v for k, v in record["summary"]["final_metrics"].items()
                     if k.endswith("_loss") and v is not None]  # test_loss, or val_loss
        assert evaluated and all(math.isfinite(v) for v in evaluated)
    assert all(bool(torch.isfinite(t).all()) for t in result.state.values())


@pytest.mark.parametrize("case", TRAINED, ids=lambda case: case.id)
def test_each_accepted_combination_trains_and_a_synchronous_one_ends_as_one_worker(results,
                                                                                   case):
    result = results.of(case)
    if result.error is not None:
        pytest.fail(f"{case.id}: {result.error}", pytrace=False)
    check_record(case, result)
    reference = results.of(case.reference(), workers=1)
    if reference.error is not None:
        pytest.fail(f"the reference of {case.id}: {reference.error}", pytrace=False)
    if not sync.traits_of(case.strategy).exchanges:  # the baseline: the control, which differs
        assert distance(result.state, reference.state) > 1e-3
    if not case.expected().foundation:
        return
    if case.precision == "fp32":
        assert_same(result.state, reference.state)
        return
    baseline = results.of(dataclasses.replace(case, strategy=sync.BASELINE))
    if baseline.error is not None:
        pytest.fail(f"the baseline of {case.id}: {baseline.error}", pytrace=False)
    assert distance(result.state, reference.state) \
        <= BF16_SHARE * distance(baseline.state, reference.state)


@pytest.mark.parametrize("fault, said", [("raise@1:2", "rank 1: RuntimeError"),
                                         ("kill@0:2", "rank 0: the process was killed by SIGKILL")])
def test_a_case_that_fails_is_named_and_the_next_one_starts_clean(results, fault, said):
    case = TRAINED[0]
    failing = dataclasses.replace(results.prepare(case, 2), env={contract.FAULT: fault})
    failing.out = failing.out.with_name(f"{failing.out.name}-{fault}")
    [failed] = results.world.run([failing])
    assert failed.error is not None and failed.error.startswith(said), failed.error
    [again] = results.world.run([dataclasses.replace(failing, env={})])
    assert again.error is None and again.record["status"] == "ok"
