"""Strategy names and options: checked before any worker starts, one line each."""
import subprocess
import sys

import pytest

from parascale import sync
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.validation import validate


def test_every_strategy_is_registered():
    assert sync.names() == ["allreduce", "reduce-broadcast", "parameter-server", "local-sgd",
                            "sma", "zero", "fsdp", "none"]


@pytest.mark.parametrize("options, message", [
    (dict(period=4), "--period 4 belongs to --sync local-sgd, not --sync allreduce"),
    (dict(sync="reduce-broadcast", ps_servers=2),
     "--ps-servers 2 belongs to --sync parameter-server, not --sync reduce-broadcast"),
    (dict(sync="local-sgd", compression="fp16"),
     "--compression fp16 belongs to --sync allreduce, not --sync local-sgd"),
    (dict(powersgd_rank=4), "--powersgd-rank 4 belongs to --compression powersgd"),
    (dict(sync="local-sgd", period=0), "--period must be a positive int, got 0"),
    (dict(sync="parameter-server", ps_servers=0), "--ps-servers must be a positive int, got 0"),
    (dict(sync="parameter-server", ps_mode="hogwild"),
     "--ps-mode must be one of sync, async, got 'hogwild'"),
    (dict(compression="zip"), "--compression must be one of none, fp16, bf16, powersgd"),
    (dict(sync="parameter-server", precision="fp16"), "--precision fp16 does not work"),
    (dict(sync_options={"period": 4}), "--period 4 belongs to --sync local-sgd"),
    (dict(periods=4), "unknown training option(s) periods; did you mean period?"),
])
def test_bad_strategy_options_are_usage_errors(options, message):
    with pytest.raises(UsageError) as caught:
        validate(TrainConfig.from_dict(options))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_options_of_the_chosen_strategy_and_of_none_are_accepted():
    validate(TrainConfig.from_dict(dict(sync="local-sgd", period=8)))
    validate(TrainConfig.from_dict(dict(sync="parameter-server", ps_mode="async",
                                        ps_servers=3)))
    validate(TrainConfig.from_dict(dict(compression="powersgd", powersgd_rank=4)))
    # --sync none ignores strategy options, so any run's baseline differs in --sync alone
    validate(TrainConfig.from_dict(dict(sync="none", period=8, ps_servers=2)))


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(UsageError, match="did you mean 'local-sgd'.*parameter-server"):
        sync.check("local_sgd")


@pytest.mark.slow
def test_cli_reports_a_misplaced_option_on_one_line_with_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "parascale", "train", "--workers", "2",
                           "--period", "4", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == ("parascale: error: --period 4 belongs to --sync local-sgd, "
                           "not --sync allreduce (sma takes it too)\n")
    assert not (tmp_path / "run").exists()
