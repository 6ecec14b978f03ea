"""The search space: spellings on the command line and in files, and what is refused up front."""
from __future__ import annotations

import optuna
import pytest

from parascale.errors import UsageError
from parascale.hpo import space
from parascale.hpo.slots import make_slots


def test_command_line_spellings():
    lr = space.parse_param("lr=0.001:0.5:log")
    assert (lr.low, lr.high, lr.log, lr.integer) == (0.001, 0.5, True, False)
    batch = space.parse_param("batch-size=16,32,64")
    assert (batch.name, batch.choices) == ("batch_size", (16, 32, 64))
    period = space.parse_param("period=2:16")
    assert period.integer and (period.low, period.high) == (2, 16)
    rule = space.parse_param("lr_scaling=none,linear,sqrt")
    assert rule.choices == ("none", "linear", "sqrt")


@pytest.mark.parametrize("text, words", [
    ("lr=0.1", "one value"),
    ("lr", "expected NAME=A,B,C"),
    ("nosuch=1,2", "unknown option 'nosuch'"),
    ("lrr=1,2", "did you mean lr"),
    ("workers=1,2", "not searched"),
    ("batch_size=8.5:64", "takes integers"),
    ("lr=0.5:0.1", "LOW < HIGH"),
    ("lr=0:1:log", "log range needs LOW > 0"),
    ("lr=a:b", "finite number"),
    ("lr=0.1:nan", "finite number"),
    ("lr=1:2:3", "LOW:HIGH or LOW:HIGH:log"),
    ("batch_size=16,16", "twice"),
    ("sync=allreduce:local-sgd", "finite number"),
])
def test_bad_params_are_one_line(text, words):
    with pytest.raises(UsageError, match=words):
        space.parse_param(text)


def test_a_space_file(tmp_path):
    file = tmp_path / "space.yaml"
    file.write_text("lr: 0.01:0.5:log\nbatch_size: [16, 32]\nmomentum: {low: 0.8, high: 0.99}\n")
    found = {p.name: p for p in space.load_space(file)}
    assert found["lr"].log and found["batch_size"].choices == (16, 32)
    assert (found["momentum"].low, found["momentum"].high, found["momentum"].log) == \
        (0.8, 0.99, False)
    json_file = tmp_path / "space.json"
    json_file.write_text('{"weight_decay": [0, 0.0001]}')
    assert space.load_space(json_file)[0].choices == (0, 0.0001)
    for text, words in [("[1, 2]", "must map option names"), ("lr: {low: 1}", "expected a list"),
                        ("lr: {low: 0.1, high: 1, log: maybe}", "log is true or false"),
                        ("lr: 5", "expected a list")]:
        file.write_text(text)
        with pytest.raises(UsageError, match=words):
            space.load_space(file)
    with pytest.raises(UsageError, match="does not exist"):
        space.load_space(tmp_path / "none.yaml")
    with pytest.raises(UsageError, match="twice|more than once"):
        space.merge([space.parse_param("lr=0.1:0.2")], [space.parse_param("lr=1,2")])
    with pytest.raises(UsageError, match="nothing to search"):
        space.merge([], [])


def test_strategy_options_are_drawn_only_with_their_strategy():
    params = [space.parse_param("sync=allreduce,local-sgd"), space.parse_param("period=2:8")]
    space.check(params, {"model": "smallcnn"})
    assert space.settings(params, {}, lambda p: p.corners()[0]) == {"sync": "allreduce"}
    local = space.settings(params, {}, lambda p: "local-sgd" if p.name == "sync" else 4)
    assert local == {"sync": "local-sgd", "period": 4}
    with pytest.raises(UsageError, match="option of --sync local-sgd, sma, which no trial"):
        space.check([space.parse_param("period=2:8")], {"sync": "allreduce"})
    # an option without a field travels in sync_options
    chosen = space.config({"sync": "sma"}, {"learner_engine": "vmap", "lr": 0.1})
    assert chosen == {"sync": "sma", "sync_options": {"learner_engine": "vmap"}, "lr": 0.1}


def test_values_the_trainer_refuses_are_refused_before_the_search():
    with pytest.raises(UsageError, match="batch_size in 16, 32: with batch_size=16: give "
                       "--batch-size"):
        space.check([space.parse_param("batch_size=16,32")], {"global_batch": 64})
    with pytest.raises(UsageError, match="momentum"):
        space.check([space.parse_param("momentum=-0.5:0.9")], {})


def test_drawing_from_optuna_follows_the_declared_kinds():
    study = optuna.create_study()
    params = [space.parse_param("lr=0.001:0.5:log"), space.parse_param("batch_size=16:64"),
              space.parse_param("sync=allreduce,local-sgd"), space.parse_param("period=2:8")]
    for _ in range(10):
        trial = study.ask()
        chosen = space.settings(params, {}, lambda p: p.suggest(trial))  # noqa: B023
        assert 0.001 <= chosen["lr"] <= 0.5 and isinstance(chosen["batch_size"], int)
        assert ("period" in chosen) == (chosen["sync"] == "local-sgd")
        study.tell(trial, 0.5)


def test_slots_are_disjoint_and_sized():
    assert [s.cores for s in make_slots(1, cores=[0, 1])] == [(0,), (1,)]
    assert [s.cores for s in make_slots(2, cores=[0, 1, 2, 3, 4])] == [(0, 1), (2, 3)]
    gpus = make_slots(2, gpus=(0, 1, 2, 3), cores=[0, 1, 2, 3, 4, 5, 6, 7])
    assert [(s.gpus, s.cores) for s in gpus] == [((0, 1), (0, 1, 2, 3)),
                                                 ((2, 3), (4, 5, 6, 7))]
    assert make_slots(1, gpus=(0, 1, 2), cores=[0])[2].cores == (0,)  # cores shared
    with pytest.raises(UsageError, match="more than the 2 CPU cores"):
        make_slots(3, cores=[0, 1])
    with pytest.raises(UsageError, match="positive"):
        make_slots(0, cores=[0, 1])
