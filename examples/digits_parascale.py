"""The plain PyTorch script of examples/digits_plain.py made a parascale script: the lines
marked "# parascale" are all that changed.

    parascale run --workers 2 examples/digits_parascale.py --epochs 3 --batch-size 16
    python examples/digits_parascale.py   # still runs alone, as the plain script does
"""
import argparse

import parascale.script as ps  # parascale

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def data():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, test = order[:1437], order[1437:]
    return TensorDataset(x[train], y[train]), (x[test], y[test])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--save", help="write the final parameters here")
    args = parser.parse_args()

    torch.manual_seed(0)
    run = ps.start()  # parascale
    train, (x_test, y_test) = data()
    loader = run.shard(DataLoader(train, batch_size=args.batch_size, shuffle=True))  # parascale
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    model, optimizer = run.setup(model, optimizer)  # parascale
    for epoch in range(1, args.epochs + 1):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            run.backward(loss)  # parascale
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        run.log(accuracy=accuracy)  # parascale
        print(f"epoch {epoch}: loss {loss.item():.4f}, test accuracy {accuracy:.2%}")
    if args.save:
        run.save(args.save, model=model)  # parascale


if __name__ == "__main__":
    main()
