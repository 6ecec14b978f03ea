"""imagefolder: PNG files in class folders, read per sample through a DataLoader."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from parascale import data
from parascale.config import TrainConfig
from parascale.data.folder import BadImage
from helpers import assert_refused, one_line, train_captured
from parascale.errors import UsageError

CPU = torch.device("cpu")
MEAN = torch.tensor([0.485, 0.456, 0.406]).reshape(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).reshape(3, 1, 1)


def png(path: Path, seed: int, size: tuple[int, int] = (6, 5), mode: str = "RGB") -> np.ndarray:
    """Write a random image of (width, height) `size`; return its pixels as RGB (H, W, 3)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    image = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)
    image.save(path)
    return np.array(image.convert("RGB"))


def make_tree(root: Path) -> dict[str, list[np.ndarray]]:
    """train/{cat,dog} with 3 images each (one greyscale); val/ holds only dogs."""
    pixels = {"train": [], "val": []}
    for i in range(6):
        cls = "cat" if i < 3 else "dog"
        pixels["train"].append(png(root / "train" / cls / f"{i}.png", i, mode="L" if i == 4 else "RGB"))
    for i in range(2):
        pixels["val"].append(png(root / "val" / "dog" / f"{i}.png", 10 + i))
    return pixels


def normalised(rgb: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(rgb).permute(2, 0, 1).float() / 255 - MEAN) / STD


@pytest.mark.parametrize("loader_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_imagefolder_batches_follow_the_index_lists(tmp_path, loader_workers):
    pixels = make_tree(tmp_path)
    cfg = TrainConfig.of(dataset="imagefolder", data_dir=str(tmp_path))
    data.check(cfg)
    bundle = data.build(cfg)
    assert (len(bundle.train), len(bundle.test), bundle.num_classes) == (6, 2, 2)
    assert bundle.input_shape == (3, 5, 6)
    order = [[4, 0, 5], [2], [1, 3]]
    got = list(bundle.train.batches(order, CPU, train=True, loader_workers=loader_workers))
    assert len(got) == 3
    for idx, (x, y) in zip(order, got):
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert y.tolist() == [0 if i < 3 else 1 for i in idx]
        torch.testing.assert_close(x, torch.stack([normalised(pixels["train"][i]) for i in idx]))
    # val/ lacks "cat": dogs must keep the training label 1, not become class 0
    _, y = next(bundle.test.batches([[0, 1]], CPU, train=False))
    assert y.tolist() == [1, 1]


def test_imagefolder_resize_and_reproducible_augmentation(tmp_path):
    make_tree(tmp_path)
    cfg = TrainConfig.of(dataset="imagefolder", data_dir=str(tmp_path), image_size=12, augment=True)
    bundle = data.build(cfg)
    assert bundle.input_shape == (3, 12, 12)

    def run(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return next(bundle.train.batches([[0, 1, 2, 3, 4, 5]], CPU, train=True, generator=gen))[0]

    assert run(0).shape == (6, 3, 12, 12)
    assert torch.equal(run(0), run(0)) and not torch.equal(run(0), run(1))
    plain = next(bundle.train.batches([[0, 1, 2, 3, 4, 5]], CPU, train=False))[0]
    assert not torch.equal(run(0), plain)


def test_test_folder_is_accepted_without_val(tmp_path):
    make_tree(tmp_path)
    (tmp_path / "val").rename(tmp_path / "test")
    assert len(data.build(TrainConfig.of(dataset="imagefolder", data_dir=str(tmp_path))).test) == 2


def check_fails(root: Path, *patterns: str) -> str:
    with pytest.raises(UsageError) as err:
        data.check(TrainConfig.of(dataset="imagefolder", data_dir=str(root)))
    message = str(err.value)
    assert "\n" not in message
    for pattern in patterns:
        assert pattern in message, message
    return message


def test_layout_errors(tmp_path):
    check_fails(tmp_path, "no train/ and val/ (or test/)", "train/<class>/<image>")
    png(tmp_path / "train" / "cat" / "a.png", 0)
    check_fails(tmp_path, "no val/ (or test/)")
    (tmp_path / "val" / "cow").mkdir(parents=True)
    check_fails(tmp_path, "classes not in", "cow")
    (tmp_path / "val" / "cow").rmdir()
    (tmp_path / "val" / "cat").mkdir()
    check_fails(tmp_path, "no images in", "val")
    png(tmp_path / "val" / "cat" / "b.png", 1)
    (tmp_path / "train" / "dog").mkdir()
    (tmp_path / "train" / "dog" / "notes.txt").write_text("not an image")
    check_fails(tmp_path, "dog holds no images", ".png")


def test_differing_sizes_ask_for_image_size(tmp_path):
    png(tmp_path / "train" / "cat" / "a.png", 0, size=(6, 5))
    png(tmp_path / "train" / "dog" / "b.png", 1, size=(8, 8))
    png(tmp_path / "val" / "cat" / "c.png", 2, size=(6, 5))
    check_fails(tmp_path, "differ in size", "6x5", "8x8", "--image-size")
    cfg = TrainConfig.of(dataset="imagefolder", data_dir=str(tmp_path), image_size=7)
    data.check(cfg)
    x, _ = next(data.build(cfg).train.batches([[0, 1]], CPU, train=False))
    assert x.shape == (2, 3, 7, 7)


def test_sizes_differing_beyond_the_sampled_images_fail_clearly_in_batches(tmp_path):
    png(tmp_path / "train" / "cat" / "a.png", 0, size=(6, 5))
    png(tmp_path / "train" / "cat" / "b.png", 1, size=(8, 8))  # not sampled by check()
    png(tmp_path / "val" / "cat" / "c.png", 2, size=(6, 5))
    bundle = data.build(TrainConfig.of(dataset="imagefolder", data_dir=str(tmp_path)))
    with pytest.raises(BadImage, match="differ in size; pass --image-size"):
        list(bundle.train.batches([[0, 1]], CPU, train=False))


@pytest.mark.slow
def test_unreadable_image_is_a_usage_error_or_a_bad_image_in_training(tmp_path):
    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "train" / "cat" / "broken.png").write_bytes(b"not a png")
    png(tmp_path / "val" / "cat" / "c.png", 2)
    check_fails(tmp_path, "cannot read image", "broken.png")
    # with --image-size, check() reads no image headers: the error comes when the batch is read
    png(tmp_path / "train" / "cat" / "a.png", 0)
    bundle = data.build(TrainConfig.of(dataset="imagefolder", data_dir=str(tmp_path), image_size=4))
    for workers in (0, 1):
        with pytest.raises(BadImage) as err:
            list(bundle.train.batches([[0, 1]], CPU, train=False, loader_workers=workers))
        assert str(err.value).startswith(  # one line naming the file, from a loader worker too
            f"imagefolder: cannot read {tmp_path / 'train' / 'cat' / 'broken.png'}: ")
        assert "\n" not in str(err.value)


def image_tree(root, broken=(), sizes=None) -> int:
    """train/{a,b}/ and val/{a,b}/ of 8x8 PNGs (3 per class each); ``broken`` names files
    written as garbage, ``sizes`` maps names to another (width, height). Returns the count."""
    import numpy as np
    from PIL import Image

    count = 0
    for split in ("train", "val"):
        for cls in ("a", "b"):
            for i in range(3):
                name = f"{split}-{cls}{i}.png"
                path = root / split / cls / name
                path.parent.mkdir(parents=True, exist_ok=True)
                count += 1
                if name in broken:
                    path.write_bytes(b"not a png at all")
                    continue
                size = (sizes or {}).get(name, (8, 8))
                pixels = np.random.default_rng(count).integers(0, 256, (size[1], size[0], 3))
                Image.fromarray(pixels.astype(np.uint8)).save(path)
    return count


@pytest.mark.slow
def test_unreadable_image_during_training_is_one_line_naming_it(tmp_path, capfd):
    # --image-size: preflight reads no image, so the bad file is met by a batch
    image_tree(tmp_path / "data", broken=("train-b1.png",))
    proc, record = train_captured(tmp_path, capfd, "--dataset", "imagefolder", "--data-dir",
                                  str(tmp_path / "data"), "--image-size", "8", "--model", "mlp",
                                  "--workers", "2", "--batch-size", "3", "--epochs", "1")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    bad = tmp_path / "data" / "train" / "b" / "train-b1.png"
    assert f"failed: imagefolder: cannot read {bad}: " in last, last
    assert record["status"] == "failed" and "UnidentifiedImageError" in record["detail"]


def test_verify_data_names_the_first_bad_image_and_counts_them(capsys, tmp_path):
    total = image_tree(tmp_path / "data", broken=("train-a2.png", "val-b0.png"))
    line = assert_refused(capsys, tmp_path, "--dataset", "imagefolder", "--data-dir",
                          str(tmp_path / "data"), "--image-size", "8", "--verify-data",
                          words=[f"cannot read {tmp_path / 'data' / 'train' / 'a' / 'train-a2.png'}",
                                 f"2 of {total} images cannot be read"])
    assert "val-b0.png" not in line


def test_verify_data_finds_sizes_that_differ_beyond_the_sampled_images(tmp_path):
    from parascale import data

    image_tree(tmp_path, sizes={"train-a1.png": (9, 8)})  # not the first of its class
    cfg = TrainConfig.of(dataset="imagefolder", data_dir=str(tmp_path))
    data.check(cfg)  # one image per class: all 8x8
    with pytest.raises(UsageError) as exc:
        data.check(cfg.replace(verify_data=True))
    assert "differ in size" in one_line(exc) and "train-a1.png is 9x8" in one_line(exc)
    data.check(cfg.replace(verify_data=True, image_size=8))
