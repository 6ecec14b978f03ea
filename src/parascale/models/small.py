"""Small models without BatchNorm: ``mlp``, ``smallcnn`` and ``lenet``.

None of them has BatchNorm (or dropout), so the loss of a batch does not depend on how the batch
is split over workers: data-parallel runs can be checked for exact equivalence with one worker.
Every model works for any input shape (C, H, W) with H, W >= 8; the sizes of the fully connected
layers are found by a dry forward pass at construction, so no lazy modules are needed.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP", "SmallCNN", "LeNet"]


def _flat_size(features: nn.Module, input_shape: tuple[int, int, int]) -> int:
    """Number of features ``features`` yields for one sample (a dry run on zeros, no RNG used)."""
    with torch.no_grad():
        return int(features(torch.zeros(1, *input_shape)).flatten(1).shape[1])


class MLP(nn.Module):
    """Two hidden layers of 128 units on the flattened input."""

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int]):
        super().__init__()
        c, h, w = input_shape
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, 128), nn.ReLU(),
            nn.Linear(128, 128), nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x)


class SmallCNN(nn.Module):
    """Two 3x3 convolutions, one 2x2 max-pool and two linear layers.

    The default for the 8x8 digits data: about 0.15M parameters there, so an epoch of ~1,400
    samples takes a fraction of a second on one CPU core. The first linear layer grows with H*W
    (64*H*W/4 inputs), so larger images are better served by the ResNets.
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int]):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(input_shape[0], 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(_flat_size(self.features, input_shape), 128), nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _pool_kernel(h: int, w: int, min_after: int) -> tuple[int, int]:
    """2 along each side that stays at least ``min_after`` when halved, else 1 (no pooling)."""
    return (2 if h // 2 >= min_after else 1, 2 if w // 2 >= min_after else 1)


def _avg_pool(kernel: tuple[int, int]) -> nn.Module:
    return nn.Identity() if kernel == (1, 1) else nn.AvgPool2d(kernel, stride=kernel)


class LeNet(nn.Module):
    """LeNet-5 as in Dive into Deep Learning (section 7.6), with ReLU instead of sigmoid.

    On 28x28 inputs it is exactly the book's network (16*5*5 features before the first linear
    layer). Smaller inputs would shrink to nothing, so a pooling is skipped along a side that
    would get too small: the first pooling only if the 5x5 convolution after it still fits, the
    second only if at least 2 pixels remain (8x8 digits: 8 -> 8 -> 4 -> 2).
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int]):
        super().__init__()
        c, h, w = input_shape
        pool1 = _pool_kernel(h, w, min_after=5)  # conv1 keeps the size (padding 2)
        h1, w1 = h // pool1[0], w // pool1[1]
        pool2 = _pool_kernel(h1 - 4, w1 - 4, min_after=2)  # conv2 has no padding
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, 5, padding=2), nn.ReLU(), _avg_pool(pool1),
            nn.Conv2d(6, 16, 5), nn.ReLU(), _avg_pool(pool2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(_flat_size(self.features, input_shape), 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
