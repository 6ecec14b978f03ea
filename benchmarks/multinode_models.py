"""A model whose gradient is large and whose compute is small, for benchmarks/multinode_predict.py:
64 -> 2000 -> 2000 -> 10, about 4.15 M parameters (16.6 MB of float32 gradient, 27 times
smallcnn's), so that the link, not the CPU, sets its step time under a cap."""
from torch import nn


def wide_mlp(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 2000), nn.ReLU(),
                         nn.Linear(2000, 2000), nn.ReLU(), nn.Linear(2000, num_classes))
