"""In-memory splits: exact index batches, normalisation, resize and reproducible augmentation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parascale.data.split import PAD, TensorSplit, augment

CPU = torch.device("cpu")


def image_split(n: int = 12, *, augment: bool = False, image_size: int | None = None) -> TensorSplit:
    x = torch.randint(0, 256, (n, 3, 6, 5), generator=torch.Generator().manual_seed(0),
                      dtype=torch.uint8)
    y = torch.arange(n) % 4
    return TensorSplit(x, y, (0.5, 0.4, 0.3), (0.2, 0.25, 0.5), scale=1 / 255,
                       augment=augment, image_size=image_size)


def expected(split: TensorSplit, idx: list[int]) -> torch.Tensor:
    mean = torch.tensor([0.5, 0.4, 0.3]).reshape(1, 3, 1, 1)
    std = torch.tensor([0.2, 0.25, 0.5]).reshape(1, 3, 1, 1)
    return (split.x[idx].float() / 255 - mean) / std


def test_one_batch_per_index_list_with_exactly_those_samples_in_order():
    split = image_split()
    order = [[9, 2, 2, 0], [11], torch.tensor([3, 1, 10])]
    got = list(split.batches(order, CPU, train=True))
    assert len(got) == 3
    for idx, (x, y) in zip(order, got):
        idx = torch.as_tensor(idx).tolist()
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.device == CPU and y.device == CPU
        assert y.tolist() == [i % 4 for i in idx]
        torch.testing.assert_close(x, expected(split, idx))


def test_batches_do_not_modify_the_stored_samples():
    split = TensorSplit(torch.rand(4, 1, 3, 3), torch.zeros(4), (0.5,), (0.25,))
    before = split.x.clone()
    list(split.batches([[0, 1, 2, 3]], CPU, train=False))
    assert torch.equal(split.x, before)


def test_out_of_range_index_fails_loudly():
    with pytest.raises(IndexError):
        list(image_split().batches([[0, 12]], CPU, train=False))


def test_resize_is_bilinear_to_the_square_size():
    split = image_split(image_size=9)
    x, _ = next(split.batches([[4, 5]], CPU, train=False))
    assert x.shape == (2, 3, 9, 9)
    want = F.interpolate(expected(split, [4, 5]), size=(9, 9), mode="bilinear",
                         align_corners=False, antialias=False)
    torch.testing.assert_close(x, want)


def augmented(split: TensorSplit, seed: int, *, train: bool = True) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([x for x, _ in split.batches([[0, 1, 2, 3], [4, 5, 6, 7]], CPU,
                                                  train=train, generator=gen)])


def test_augmentation_is_reproducible_from_the_generator_alone():
    split = image_split(augment=True)
    torch.manual_seed(1)
    first = augmented(split, 7)
    torch.manual_seed(2)  # the global RNG must not matter
    assert torch.equal(first, augmented(split, 7))
    assert not torch.equal(first, augmented(split, 8))


def test_augmentation_does_not_touch_the_global_rng():
    state = torch.get_rng_state()
    augmented(image_split(augment=True), 3)
    assert torch.equal(state, torch.get_rng_state())


def test_no_augmentation_for_evaluation_or_when_disabled():
    plain = expected(image_split(), list(range(8)))
    torch.testing.assert_close(augmented(image_split(augment=True), 7, train=False), plain)
    torch.testing.assert_close(augmented(image_split(augment=False), 7), plain)


def test_each_augmented_sample_is_a_padded_crop_possibly_flipped():
    x = torch.randn(32, 2, 6, 7)
    out = augment(x, torch.Generator().manual_seed(0))
    padded = F.pad(x, (PAD,) * 4)
    flips = set()
    for i in range(len(x)):
        matches = [(dy, dx, flip) for dy in range(2 * PAD + 1) for dx in range(2 * PAD + 1)
                   for flip in (False, True)
                   if torch.equal(out[i], (lambda c: c.flip(-1) if flip else c)(
                       padded[i, :, dy:dy + 6, dx:dx + 7]))]
        assert matches, f"sample {i} is not a crop/flip of its padded input"
        flips.add(matches[0][2])
    assert flips == {False, True}  # 32 fair coin flips all landing the same way: p = 2^-31
