"""Sharded from the first byte (issue 33): under a strategy that shards the parameters, the model
is built without storage and each rank materialises its own shards, bit for bit the values a
whole build gives (models/deferred.py, training/loop/building.py, sync/fsdp.py); what cannot be
replayed is built whole, saying why; what FSDP cannot shard is one line before any worker."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import STEPS, assert_same, run_training, usable_hierarchy
from torch import nn

from parascale import flops, models
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.models import deferred
from parascale.runtime.world import World
from parascale.sync.fsdp import groups
from parascale.training import preflight
from parascale.training.loop import building

HERE = Path(__file__).resolve().parent
SIZES = {"gpt": dict(gpt_layers=2, gpt_heads=2, gpt_width=16)}


def shape_of(name: str) -> tuple[int, ...]:
    return (16,) if name == "gpt" else (3, 16, 16)


def factory_of(name: str):
    return lambda: models.build(name, 65 if name == "gpt" else 10, shape_of(name),
                                **SIZES.get(name, {}))


class Everything(nn.Module):
    """What a construction may do that the replay must follow: torch.nn.init's initialisers
    that skip meta tensors (truncated normal, orthogonal), a fill through a view (padding_idx),
    a copy from another parameter, buffers from Python data and from a factory, a plain tensor
    attribute, an in-place change after the initialiser, and tied weights."""

    def __init__(self, num_classes: int = 10, input_shape: tuple = (3, 4, 4)):
        super().__init__()
        features = math.prod(input_shape)
        self.embed = nn.Embedding(12, 8, padding_idx=0)
        self.a = nn.Linear(features, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, num_classes)
        nn.init.trunc_normal_(self.a.weight, std=0.02)
        nn.init.orthogonal_(self.b.weight)
        self.b.weight.data.mul_(0.5)
        with torch.no_grad():
            self.c.bias.copy_(self.a.bias[:num_classes].flip(0))
        self.register_buffer("count", torch.tensor(3))
        self.register_buffer("steps", torch.arange(5).float().sqrt())
        self.scale = torch.linspace(0, 1, 16)
        self.d = nn.Linear(16, 16, bias=False)
        self.d.weight = self.b.weight

    def forward(self, x):
        return self.c(self.d(self.b(self.a(x.flatten(1)))) * self.scale)


def mixed_dtypes(num_classes: int, input_shape: tuple) -> nn.Module:
    """A model FSDP cannot shard: an int64 parameter beside float32 ones."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
    model.register_parameter("count", nn.Parameter(torch.zeros(2, dtype=torch.int64),
                                                   requires_grad=False))
    return model


class Tied(nn.Module):
    """Weights tied across two of the model's children, which FSDP shards as units: torch's
    own check refused them with a raw ValueError at the first forward."""

    def __init__(self, num_classes: int, input_shape: tuple):
        super().__init__()
        self.a = nn.Linear(math.prod(input_shape), 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 16)
        self.head = nn.Linear(16, num_classes)
        self.c.weight = self.b.weight

    def forward(self, x):
        return self.head(torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x.flatten(1))))))))


def tied(num_classes: int, input_shape: tuple) -> nn.Module:
    return Tied(num_classes, input_shape)


class ReadsValues(nn.Module):
    """A construction that branches on a value: a meta tensor has none."""

    def __init__(self, num_classes: int, input_shape: tuple):
        super().__init__()
        self.a = nn.Linear(math.prod(input_shape), num_classes)
        if self.a.weight.abs().max().item() > 10:
            raise AssertionError("never")

    def forward(self, x):
        return self.a(x.flatten(1))


def reads_values(num_classes: int, input_shape: tuple) -> nn.Module:
    return ReadsValues(num_classes, input_shape)


def whole_and_replayed(factory, seed: int = 5):
    torch.manual_seed(seed)
    whole = factory()
    after_whole = torch.rand(4)
    torch.manual_seed(seed)
    meta = deferred.build(factory)
    after_meta = torch.rand(4)
    return whole, meta, after_whole, after_meta


@pytest.mark.parametrize("factory", [factory_of(n) for n in models.names()]
                         + [Everything, lambda: models.build("mobilenet_v3_small", 10, (3, 32, 32))],
                         ids=models.names() + ["everything", "mobilenet_v3_small"])
def test_a_model_built_without_storage_replays_to_the_whole_build_bit_for_bit(factory):
    whole, meta, after_whole, after_meta = whole_and_replayed(factory)
    assert all(t.is_meta for t in [*meta.parameters(), *meta.buffers()])
    assert torch.equal(after_whole, after_meta)  # the generator ends where a whole build's does
    recipe = deferred.recipe_of(meta)
    expected = whole.state_dict()
    for name, value in expected.items():
        assert torch.equal(recipe.value(name), value), name
    deferred.materialise(meta, torch.device("cpu"))
    assert deferred.recipe_of(meta) is None
    got = meta.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    if isinstance(whole, Everything):
        assert torch.equal(meta.scale, whole.scale) and meta.d.weight is meta.b.weight


@pytest.mark.parametrize("build, words", [
    (lambda: ReadsValues(10, (1, 4, 4)),
     "building it without storage failed: RuntimeError: Tensor.item() cannot be called"),
    (lambda: nn.Linear(4, 4, device="cpu"), "its weight was made on cpu by the model itself"),
    (lambda: _holding_a_list(), "the model.tensors holds tensors that are neither parameters"),
    (lambda: _skipping_meta(), "its weight is never written as it is built without storage"),
    (lambda: _resized(), "it calls resize_ on a tensor"),
])
def test_what_cannot_be_replayed_says_why_and_leaves_the_generator_alone(build, words):
    torch.manual_seed(1)
    before = torch.get_rng_state()
    with pytest.raises(deferred.NotReplayable) as caught:
        deferred.build(build)
    assert words in str(caught.value)
    assert torch.equal(torch.get_rng_state(), before)


def _holding_a_list() -> nn.Module:
    model = nn.Linear(2, 2)
    model.tensors = [torch.zeros(2)]
    return model


def _skipping_meta() -> nn.Module:
    """An initialiser of its own that returns at once on a meta tensor, as torch's do."""
    model = nn.Module()
    model.weight = nn.Parameter(torch.empty(3, 3))
    if not model.weight.is_meta:
        nn.init.ones_(model.weight)
    return model


def _resized() -> nn.Module:
    model = nn.Linear(2, 2)
    model.weight.data.resize_(4, 1)
    return model


def world_of(size: int) -> World:
    return World(rank=0, size=size, local_rank=0, device=torch.device("cpu"), backend="gloo",
                 launcher="local")


def test_the_strategys_traits_decide_what_is_built_without_storage(capsys):
    factory = factory_of("mlp")
    fsdp, allreduce = TrainConfig.of(sync="fsdp"), TrainConfig.of(sync="allreduce")
    assert all(p.is_meta for p in building.build_model(fsdp, world_of(2), factory).parameters())
    for cfg, size in ((fsdp, 1), (allreduce, 2)):  # one worker holds every shard anyway
        assert not any(p.is_meta for p in building.build_model(cfg, world_of(size),
                                                               factory).parameters())
    assert capsys.readouterr().out == ""


def test_a_model_that_cannot_be_replayed_is_built_whole_saying_why_in_one_line(capsys):
    model = building.build_model(TrainConfig.of(sync="fsdp", seed=3), world_of(2),
                                 lambda: ReadsValues(10, (1, 4, 4)))
    torch.manual_seed(3)
    assert torch.equal(model.a.weight, ReadsValues(10, (1, 4, 4)).a.weight)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["parascale: --sync fsdp builds ReadsValues whole on every rank, then shards "
                   "it (building it without storage failed: RuntimeError: Tensor.item() "
                   "cannot be called on meta tensors): each rank holds all of its parameters "
                   "(0 MiB) until then"], out


def test_a_model_without_storage_counts_the_flops_of_the_whole_one():
    whole, meta, _, _ = whole_and_replayed(factory_of("gpt"))
    batch = (torch.randint(0, 65, (2, 16)), torch.randint(0, 65, (2, 16)))

    def loss(model, b):
        return nn.functional.cross_entropy(model(b[0]).flatten(0, 1), b[1].flatten())

    assert flops.count_step(meta, batch, loss) == flops.count_step(whole, batch, loss) > 0


def test_tied_units_are_sharded_as_one_group_and_one_tied_to_the_rest_is_left_to_it():
    model = Tied(10, (1, 4, 4))
    assert groups(model) == [[model.a], [model.b, model.c], [model.head]]
    root = nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]))
    root[1][0].weight = root[0].weight  # the first block shares the model's own layer
    assert groups(root) == [[root[1][1]]]


def test_a_model_fsdp_cannot_shard_is_refused_before_any_worker_starts():
    cfg = TrainConfig.of(sync="fsdp", model="test_sharded_init:mixed_dtypes", steps=1)
    with pytest.raises(UsageError) as caught:
        preflight(cfg, 2)
    assert str(caught.value) == (
        "--sync fsdp cannot shard Sequential: its parameters mix dtypes (torch.float32, "
        "torch.int64); FSDP shards a unit's parameters as one flat buffer of one dtype; change "
        "the model, or use --sync zero, which shards the optimizer state alone")
    preflight(TrainConfig.of(model=cfg.job.model, steps=1), 2)  # allreduce: nothing to refuse
    preflight(TrainConfig.of(sync="fsdp", model=cfg.job.model, steps=1), 1)  # nothing is sharded


# --- real workers -----------------------------------------------------------------------------

WORKER = """\
import json, os, pathlib, torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from parascale import models, sync
from parascale.config import TrainConfig
from parascale.runtime import joined
from parascale.runtime.failure import serve_as_worker
from parascale.training.loop.building import build_model
from test_sharded_init import factory_of


def body():
    report = {}
    with joined("cpu", "gloo", None, 120.0, teardown=False) as world:
        for name in models.names():
            cfg = TrainConfig.of(sync="fsdp", seed=7)
            sync.validate(cfg)
            model = build_model(cfg, world, factory_of(name))
            meta = all(p.is_meta for p in model.parameters())
            after = torch.rand(4)  # the generator as the build left it
            strategy = sync.build(cfg, world)
            strategy.wrap(model)
            shards = [p.to_local().numel() for p in model.parameters()]
            distinct = len({id(p) for _, p in model.named_parameters(remove_duplicate=False)})
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                        cpu_offload=True))
            if world.is_main:
                torch.manual_seed(7)
                whole = factory_of(name)()
                expected = whole.state_dict()
                report[name] = {
                    "meta": meta, "keys": sorted(full) == sorted(expected),
                    "same": all(torch.equal(full[k], v) for k, v in expected.items()),
                    "generator": torch.equal(after, torch.rand(4)),
                    "tied": distinct == len(list(whole.parameters())),
                    "sharded": sum(shards) < sum(p.numel() for p in whole.parameters())}
    if report:
        pathlib.Path(os.environ["OUT"], "report.json").write_text(json.dumps(report))


serve_as_worker(body)
"""


@pytest.mark.slow
def test_sharded_init_gathers_to_the_replicated_init_for_every_built_in_model(tmp_path):
    from parascale.runtime import launch

    (tmp_path / "sharded_worker.py").write_text(WORKER)
    paths = os.pathsep.join([str(tmp_path), str(HERE)] + sys.path)
    outcome = launch("sharded_worker", 2, {"PYTHONPATH": paths, "OUT": str(tmp_path)})
    assert outcome.status == "ok", outcome.detail
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report) == models.names()
    for name, facts in report.items():
        assert facts == {"meta": True, "keys": True, "same": True, "generator": True,
                         "tied": True, "sharded": True}, name


@pytest.mark.slow
def test_a_model_fsdp_cannot_shard_is_one_line_and_exit_code_2_before_any_worker(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "parascale", "train", "--workers", "2",
                           "--sync", "fsdp", "--model", "test_sharded_init:mixed_dtypes",
                           "--steps", "2", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "starting" not in proc.stdout and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "parascale: error: --sync fsdp cannot shard Sequential: its parameters mix dtypes "
        "(torch.float32, torch.int64); FSDP shards a unit's parameters as one flat buffer of "
        "one dtype; change the model, or use --sync zero, which shards the optimizer state "
        "alone"]
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return {model: run_training(tmp_path_factory.mktemp("single") / "run", workers=1,
                                global_batch=32, model=model, **STEPS)[1]
            for model in ("test_sharded_init:tied", "test_sharded_init:reads_values")}


@pytest.mark.slow
def test_weights_tied_across_units_train_under_fsdp_as_on_one_worker(train_run, single):
    record, state = train_run(workers=2, global_batch=32, sync="fsdp",
                              model="test_sharded_init:tied", **STEPS)
    assert record["derived"]["sync_options"]["units"] == 5  # a, b and c (one group), head, model
    assert_same(state, single["test_sharded_init:tied"])


@pytest.mark.slow
def test_a_model_built_whole_says_so_once_and_trains_as_on_one_worker(train_run, single,
                                                                      capfd):
    _, state = train_run(workers=2, global_batch=32, sync="fsdp",
                         model="test_sharded_init:reads_values", **STEPS)
    said = [line for line in capfd.readouterr().out.splitlines() if "builds" in line]
    assert len(said) == 1 and "ReadsValues whole on every rank" in said[0], said
    assert_same(state, single["test_sharded_init:reads_values"])


@pytest.mark.slow
def test_ranks_with_unequal_evaluation_batches_evaluate_in_lockstep(train_run):
    """513 test samples at evaluation batch 256: rank 0 evaluates one batch, rank 1 two; FSDP
    gathers in forward, so rank 0 makes a second pass (without it, both would wait forever)."""
    data = dict(model="mlp", dataset="synthetic", synthetic_size=2052,
                synthetic_shape=(1, 4, 4), steps=2, seed=3, timeout=60.0)
    one, _ = train_run(workers=1, global_batch=32, **data)
    two, _ = train_run(workers=2, global_batch=32, sync="fsdp", **data)
    for key in ("test_loss", "test_accuracy"):
        assert math.isclose(two["epochs"][-1][key], one["epochs"][-1][key], rel_tol=1e-5)


@pytest.mark.slow
def test_under_a_cap_fsdp_trains_a_gpt_whose_state_does_not_fit_and_allreduce_is_oom(tmp_path):
    """A GPT of 44 M parameters with AdamW: its parameters, gradients and optimizer state
    (16 bytes a parameter, 673 MiB) do not fit a 600 MiB cap; FSDP on 2 workers holds half of
    them and never the whole model, from its first byte."""
    usable_hierarchy()
    gpt = dict(model="gpt", dataset="shakespeare", context=32, gpt_layers=14, gpt_heads=8,
               gpt_width=512, optimizer="adamw", batch_size=2, steps=2, workers=2,
               evaluate_test=False, val_fraction=0.0005, noise_scale=False, save_model=False,
               device_memory="600MiB", timeout=120.0)
    record, _ = run_training(tmp_path / "fsdp", sync="fsdp", **gpt)
    peaks = record["memory"]["cgroup_peak_bytes_per_rank"]
    assert len(peaks) == 2 and all(p < 600 << 20 for p in peaks), peaks
    held = sum(record["memory"]["split_per_rank"][0][k] for k in (
        "parameters_bytes", "gradients_bytes", "optimizer_state_bytes"))
    assert held * 2 > 600 << 20 > held  # the whole state would not fit; a rank's half does
    oom, _ = run_training(tmp_path / "allreduce", expect="oom", sync="allreduce", **gpt)
    assert "ran out of memory: its --device-memory cap is 600 MiB" in oom["reason"]
