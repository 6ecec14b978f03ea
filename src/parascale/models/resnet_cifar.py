"""CIFAR-style ResNets (He et al. 2016, "Deep Residual Learning", section 4.2).

Three stages of 16, 32 and 64 channels on a 3x3 stem, n = (depth - 2) / 6 basic blocks each,
stride 2 at the start of stages 2 and 3, global average pooling and one linear layer: 6n + 2
weighted layers. Shortcuts that change shape are 1x1 convolutions with BatchNorm (the paper's
option B; its CIFAR numbers use zero-padding, option A, which has ~1% fewer parameters).
Global average pooling makes the network accept any H, W.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "CifarResNet"]


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual connection."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-``depth`` for small images; depth must be 6n + 2 (20, 32, 44, 56, 110, ...)."""

    def __init__(self, depth: int, num_classes: int, in_channels: int = 3):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n + 2 with n >= 1, got {depth}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        stages: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        # He init (the paper's reference [13], fan-in form) keeps the activation variance
        # constant through ReLU layers; PyTorch's default init shrinks it layer by layer.
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.stages(self.stem(x))).flatten(1))


def resnet20(num_classes: int, input_shape: tuple[int, int, int]) -> CifarResNet:
    return CifarResNet(20, num_classes, in_channels=input_shape[0])


def resnet32(num_classes: int, input_shape: tuple[int, int, int]) -> CifarResNet:
    return CifarResNet(32, num_classes, in_channels=input_shape[0])


def resnet56(num_classes: int, input_shape: tuple[int, int, int]) -> CifarResNet:
    return CifarResNet(56, num_classes, in_channels=input_shape[0])
