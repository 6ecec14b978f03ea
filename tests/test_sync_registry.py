"""A strategy is one file and one registry line: its declared options reach validation, the
command line and bench without a table elsewhere. No processes: validation and parsing only."""
import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from parascale import sync
from parascale.cli.options import add_train_options, config_from_args
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.sync.base import Strategy
from parascale.validation import validate


@dataclass(frozen=True)
class GossipSettings(sync.Settings):
    fanout: int = sync.option(2, "Peers each worker talks to per step.", minimum=1)
    topology: str = sync.option("ring", "ring | random", choices=("ring", "random"))


class Gossip(Strategy):
    """A throwaway strategy, written as a new file would be."""

    name = "gossip"
    Settings = GossipSettings


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
        validate(TrainConfig.from_dict(options))
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_registered_strategy_takes_its_option_from_the_command_line(gossip):
    cfg = parse(["--sync", "gossip", "--sync-option", "fanout=4"])
    # settled: every option named
    assert cfg.strategy.sync_options == {"fanout": 4, "topology": "ring"}
    assert sync.options()["fanout"][1] == ["gossip"]
    assert Gossip(cfg, world=None).options() == {"fanout": 4, "topology": "ring"}  # the record


def test_its_help_is_in_the_parser(gossip):
    parser = argparse.ArgumentParser()
    add_train_options(parser)
    text = " ".join(parser.format_help().split())  # as printed, unwrapped
    assert "fanout (--sync gossip, int, default 2): Peers each worker" in text


def test_its_declaration_validates_the_value(gossip):
    # named as the user gives them: there is no --fanout flag (issue 32, item 14)
    assert refusal(sync="gossip", sync_options={"fanout": 0}) == \
        "--sync-option fanout must be a positive int, got 0"
    assert refusal(sync="gossip", sync_options={"topology": "star"}) == \
        "--sync-option topology must be one of ring, random, got 'star'"
    assert refusal(sync="gossip", sync_options={"fanout": "many"}) == \
        "--sync-option fanout must be an integer, got 'many'"


def test_its_option_with_another_strategy_is_refused(gossip):
    assert refusal(sync="allreduce", sync_options={"fanout": 3}) == \
        "--sync-option fanout=3 belongs to --sync gossip, not --sync allreduce"
    # at its default too: given through --sync-option, it was meant (issue 32, item 14)
    assert refusal(sync="allreduce", sync_options={"fanout": 2}) == \
        "--sync-option fanout=2 belongs to --sync gossip, not --sync allreduce"
    # --sync none ignores every strategy's options, as it ignores the built-in ones
    validate(TrainConfig.of(sync="none", sync_options={"fanout": 3}))


def test_an_option_nobody_declares_is_refused():
    assert refusal(sync_options={"fanout": 3}).startswith(
        "unknown training option(s) fanout (the strategies' options: ")
    assert refusal(fanout=3).startswith("unknown training option(s) fanout")
    assert refusal(lrr=0.1) == "unknown training option(s) lrr; did you mean lr?"


def test_a_built_in_option_through_sync_option_is_the_same_option():
    assert refusal(sync_options={"ps_mode": "async"}) == \
        "--ps-mode async belongs to --sync parameter-server, not --sync allreduce"
    cfg = TrainConfig.of(sync="parameter-server", sync_options={"ps_mode": "async"})
    validate(cfg)
    assert cfg.strategy.sync_options["ps_mode"] == "async"


def test_a_misplaced_built_in_option_is_one_line_naming_every_owner():
    assert refusal(sync="local-sgd", compression="fp16") == (
        "--compression fp16 belongs to --sync allreduce, not --sync local-sgd "
        "(reduce-broadcast, parameter-server take it too)")


@pytest.mark.parametrize("strategy", ["reduce-broadcast", "parameter-server"])
def test_compression_by_hand_takes_fp16_but_not_powersgd(strategy):
    validate(TrainConfig.of(sync=strategy, sync_options={"compression": "fp16"}))
    assert refusal(sync=strategy, compression="powersgd").startswith(
        "--compression powersgd works with --sync allreduce only")


@dataclass(frozen=True)
class _Plain(sync.Settings):
    fanout: int = 2  # no declaration: no help, no flag


@dataclass(frozen=True)
class _Setting(sync.Settings):
    lr: float = sync.option(0.1, "a name the configuration has")


@dataclass(frozen=True)
class _Other(sync.Settings):
    period: str = sync.option("often", "another option of the same name")


@pytest.mark.parametrize("settings, words", [
    (_Plain, "declare a strategy's option with"), (_Setting, "is a TrainConfig field"),
    (_Other, "one name is one option")])
def test_registering_a_strategy_whose_options_clash_is_a_programming_error(settings, words):
    with pytest.raises(ValueError, match="registered already"):
        sync.register(type("Again", (Strategy,), {"name": "allreduce"}))
    with pytest.raises(TypeError, match=words):
        sync.register(type("Clash", (Strategy,), {"name": "clash", "Settings": settings}))
    assert "clash" not in sync.names()


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


@pytest.mark.slow
def test_the_registry_is_read_without_torch():
    """names, traits, options, help and patterns, and train's --help built from them, in a fresh
    interpreter: torch stays out of it (parascale/lazy.py)."""
    script = """
import sys
from parascale import sync
from parascale.cli.main import main
for name in sync.names():
    kind = sync.get(name)
    kind.traits, kind.pattern(kind.Settings()), kind.Settings.declared(), kind.stages()
options = sync.options()
[sync.help_of(name) for name in options]
try:
    main(["train", "--help"])
except SystemExit:
    pass
assert "torch" not in sys.modules, "torch was imported"
print(len(sync.names()), len(options))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"{len(sync.names())} {len(sync.options())}"


def test_a_registered_strategy_is_handed_to_the_processes_a_launch_starts(gossip):
    from parascale.runtime import contract

    assert json.loads(os.environ[contract.STRATEGIES]) == [f"{__name__}:Gossip"]
    sync.unregister(Gossip.name)
    assert contract.STRATEGIES not in os.environ
    sync.register(Gossip)  # for the fixture to take away


def test_a_strategy_of_ones_own_by_its_module_and_class():
    cfg = TrainConfig.of(sync="toy_strategy:Toy", sync_options={"pieces": 2})
    try:
        validate(cfg)
        # the record's name
        assert (cfg.strategy.sync, cfg.strategy.sync_options) == ("toy", {"pieces": 2})
    finally:
        sync.unregister("toy")
    with pytest.raises(UsageError, match="^--sync 'no_such_module:Toy': module 'no_such_module' "
                                         "not found"):
        sync.check("no_such_module:Toy")
    with pytest.raises(UsageError, match="is not a parascale.sync.Strategy subclass"):
        sync.check("parascale.config:TrainConfig")


@dataclass(frozen=True)
class _Needing(sync.Settings):
    spread: str = sync.option("ring", "ring | random", choices=("ring", "random"))
    degree: int = sync.option(2, "Peers of a random spread.", only_with=("spread", "random"))


def test_a_settled_configuration_validates_again_as_it_is():
    """Validation names every option of the strategy (an only_with one at its default too);
    the configuration it leaves passes again unchanged (train validates, then preflight)."""
    sync.register(type("Needing", (Strategy,), {"name": "needing", "Settings": _Needing}))
    try:
        for name in sync.names():
            cfg = TrainConfig.of(sync=name)
            validate(cfg)
            once = cfg.to_dict()
            validate(cfg)
            assert cfg.to_dict() == once, name
        assert TrainConfig.of(sync="needing").strategy.sync_options == {}
        settled = TrainConfig.of(sync="needing")
        validate(settled)
        assert settled.strategy.sync_options == {"spread": "ring", "degree": 2}
    finally:
        sync.unregister("needing")


def test_whether_n_workers_must_end_as_one_follows_the_options():
    """The foundation test's trait is a strategy's at the options given: local SGD only with
    a period of 1, a compressor never, the parameter server only in sync mode."""
    def equivalence(name: str, **options) -> str | None:
        cls = sync.get(name)
        return cls.equivalence(cls.Settings.of(options))

    assert equivalence("local-sgd") == sync.UPDATE
    assert equivalence("local-sgd", period=2) is None
    assert equivalence("allreduce") == sync.GRADIENT
    assert equivalence("allreduce", compression="bf16") is None
    assert equivalence("parameter-server", ps_mode="async") is None
    assert equivalence("reduce-broadcast", compression="fp16") is None
    assert equivalence(sync.BASELINE) is None


def test_a_strategy_with_an_optimizer_of_its_own_must_refuse_scripts():
    """A script steps its own optimizer, which such a strategy would replace unseen: its traits
    are refused unless they say why it runs no script."""
    with pytest.raises(TypeError, match="give it a script_refusal"):
        sync.Traits(optimizer="sgd", optimizer_why="updates with SGD")
    assert sync.Traits(optimizer="sgd", script_refusal="it updates elsewhere").optimizer == "sgd"
