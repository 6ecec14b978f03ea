"""The minimal DDP script torchrun is timed on: one SGD step of a small MLP on random data."""
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss = nn.functional.cross_entropy(model(torch.randn(32, 1, 28, 28)), torch.randint(0, 10, (32,)))
loss.backward()
opt.step()
dist.destroy_process_group()
