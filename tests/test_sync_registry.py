"""A strategy is one file and one registry line: its declared options reach validation, the
command line and bench without a table elsewhere. No processes: validation and parsing only."""
import argparse

import pytest

from parascale import sync
from parascale.cli.options import add_train_options, config_from_args
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.sync.base import Strategy
from parascale.validation import validate


class Gossip(Strategy):
    """A throwaway strategy, written as a new file would be."""

    name = "gossip"
    declares = (sync.Option("fanout", "Peers each worker talks to per step.", minimum=1,
                            kind=int, default=2),
                sync.Option("topology", "ring | random", choices=("ring", "random"), kind=str,
                            default="ring"))


@pytest.fixture
def gossip():
    sync.register(Gossip)  # the one registry line
    yield
    sync.unregister(Gossip.name)


def parse(argv: list[str]) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_train_options(parser)
    cfg = TrainConfig.from_dict(config_from_args(parser.parse_args(argv)))
    validate(cfg)
    return cfg


def refusal(**options) -> str:
    with pytest.raises(UsageError) as caught:
        validate(TrainConfig(**options))
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_registered_strategy_takes_its_option_from_the_command_line(gossip):
    cfg = parse(["--sync", "gossip", "--sync-option", "fanout=4"])
    assert cfg.sync_options == {"fanout": 4}
    assert sync.options()["fanout"][1] == ["gossip"]
    assert Gossip(cfg, world=None).options() == {"fanout": 4, "topology": "ring"}  # the record


def test_its_help_is_in_the_parser(gossip):
    parser = argparse.ArgumentParser()
    add_train_options(parser)
    text = " ".join(parser.format_help().split())  # as printed, unwrapped
    assert "fanout (--sync gossip, int, default 2): Peers each worker" in text


def test_its_declaration_validates_the_value(gossip):
    assert refusal(sync="gossip", sync_options={"fanout": 0}) == \
        "--fanout must be a positive int, got 0"
    assert refusal(sync="gossip", sync_options={"topology": "star"}) == \
        "--topology must be one of ring, random, got 'star'"
    assert refusal(sync="gossip", sync_options={"fanout": "many"}) == \
        "--fanout must be an integer, got 'many'"


def test_its_option_with_another_strategy_is_refused(gossip):
    assert refusal(sync="allreduce", sync_options={"fanout": 3}) == \
        "--fanout 3 belongs to --sync gossip, not --sync allreduce"
    # --sync none ignores every strategy's options, as it ignores the built-in ones
    validate(TrainConfig(sync="none", sync_options={"fanout": 3}))


def test_an_option_nobody_declares_is_refused():
    assert refusal(sync_options={"fanout": 3}).startswith(
        "--sync-option fanout: no strategy declares it")


def test_a_built_in_option_through_sync_option_names_its_flag():
    assert refusal(sync_options={"ps_mode": "async"}).endswith("give it as --ps-mode")


def test_a_misplaced_built_in_option_is_one_line_naming_every_owner():
    assert refusal(sync="local-sgd", compression="fp16") == (
        "--compression fp16 belongs to --sync allreduce, not --sync local-sgd "
        "(reduce-broadcast, parameter-server take it too)")


@pytest.mark.parametrize("strategy", ["reduce-broadcast", "parameter-server"])
def test_compression_by_hand_takes_fp16_but_not_powersgd(strategy):
    validate(TrainConfig(sync=strategy, compression="fp16"))
    assert refusal(sync=strategy, compression="powersgd").startswith(
        "--compression powersgd works with --sync allreduce only")


def test_registering_a_name_twice_or_a_field_without_its_type_is_a_programming_error():
    with pytest.raises(ValueError, match="registered already"):
        sync.register(type("Again", (Strategy,), {"name": "allreduce"}))
    with pytest.raises(TypeError, match="declares both"):
        sync.register(type("Untyped", (Strategy,), {
            "name": "untyped", "declares": (sync.Option("fanout", "no type"),)}))
    assert "untyped" not in sync.names()


def test_bench_leaves_an_option_out_of_the_configurations_it_does_not_apply_to():
    from parascale.bench.study import _drop_foreign_options

    used = [{"sync": "allreduce", "compression": "powersgd"}, {"sync": "local-sgd"}]
    local = {"sync": "local-sgd", "period": 4, "powersgd_rank": 2}
    _drop_foreign_options(local, used)
    assert local == {"sync": "local-sgd", "period": 4}
    ring = {"sync": "allreduce", "compression": "powersgd", "period": 4, "powersgd_rank": 2}
    _drop_foreign_options(ring, used)
    assert ring == {"sync": "allreduce", "compression": "powersgd", "powersgd_rank": 2}


def test_bench_takes_its_option_as_a_study_variable(gossip):
    from parascale.bench.study import combine, make_jobs

    jobs = make_jobs(combine(
        options={"model": "mlp", "dataset": "digits", "steps": 2, "batch_size": 8},
        assignments=[("fanout", 3)], variables=[("sync", ["gossip", "allreduce"])],
        workers="2"))
    by_sync = {job.train["sync"]: job for job in jobs}
    assert by_sync["gossip"].train["sync_options"] == {"fanout": 3}
    assert not by_sync["allreduce"].train.get("sync_options")
