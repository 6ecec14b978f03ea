"""The combination matrix's jobs (tests/matrix_cases.py), as a user brings them to parascale.

Each job is three things at once: a task of one's own that brings its own optimizer
(``--task matrix_jobs:digits``: the image classifier, the dict-batch regression, the GPT, each
with :func:`own_optimizer`), and a training script for ``parascale run`` (this file, run as
``__main__``: ``--job digits --optimizer adamw --precision bf16 ...``). The built-in
classifier and GPT with ``--optimizer sgd|adamw`` need no file: they are ``--model`` and
``--dataset``; the regression with them is examples/regression.py's task.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from parascale import models
from parascale.tasks import Metric, Task

#: the GPT's sizes: the matrix's built-in GPT job is --model gpt with these options
GPT = {"context": 16, "gpt_layers": 1, "gpt_width": 32, "gpt_heads": 2}
#: characters of the corpus a task or script of the GPT reads (a start of the works)
CHARACTERS = 20_000


def own_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """A task's own optimizer: neither SGD nor AdamW, so that a strategy which builds its
    optimizer again (ZeRO) must take another class's constructor and defaults; its update is
    not linear in the gradient."""
    return torch.optim.RMSprop(params, lr=lr, alpha=0.9, momentum=0.5, weight_decay=1e-4)


def digits_data() -> tuple[Dataset, Dataset]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


def digits_model() -> nn.Module:
    return models.build("mlp", 10, (1, 8, 8))


class Windows(Dataset):
    """Windows of ``context`` characters and the next ``context``, every ``context``."""

    def __init__(self, ids: torch.Tensor, context: int):
        self.ids, self.context = ids.long(), context

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.context

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.context
        window = self.ids[start:start + self.context + 1]
        return window[:-1], window[1:]


def gpt_data() -> tuple[Dataset, Dataset, int]:
    from parascale.data.text import corpus, encode

    ids, vocab = encode(corpus()[:CHARACTERS])
    cut = len(ids) * 9 // 10
    return Windows(ids[:cut], GPT["context"]), Windows(ids[cut:], GPT["context"]), len(vocab)


def gpt_model(vocab: int) -> nn.Module:
    return models.build("gpt", vocab, (GPT["context"],),
                        **{k: v for k, v in GPT.items() if k != "context"})


def token_loss(net: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(net(x).flatten(0, -2).float(), y.flatten())


def class_loss(net: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(net(x).float(), y)


def accuracy(net: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return (net(x).argmax(dim=-1) == y).double().mean()


# ---- the tasks that bring their own optimizer (--task matrix_jobs:NAME) ----------------------

def digits() -> Task:
    train, test = digits_data()
    return Task(train_data=train, eval_data=test, model=digits_model, loss=class_loss,
                metrics=[Metric("accuracy", accuracy, True)], optimizer=own_optimizer,
                name="digits, own optimizer")


def regression() -> Task:
    import regression as example  # examples/regression.py, on sys.path

    return dataclasses.replace(example.task(), optimizer=own_optimizer)


def gpt() -> Task:
    train, test, vocab = gpt_data()
    return Task(train_data=train, eval_data=test, model=lambda: gpt_model(vocab),
                loss=token_loss, optimizer=own_optimizer, unit="tokens",
                units_per_sample=float(GPT["context"]), name="gpt, own optimizer")


# ---- the script (parascale run tests/matrix_jobs.py --job NAME ...) --------------------------

def _script_job(name: str):
    """(training data, model, loss) of job ``name`` for the script."""
    if name == "digits":
        return digits_data()[0], digits_model(), class_loss
    if name == "regression":
        import regression as example

        task = example.task()
        return task.train_data, task.model(), task.loss
    train, _, vocab = gpt_data()
    return train, gpt_model(vocab), token_loss


def _script_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    return own_optimizer(params, lr)


def main() -> None:
    import parascale.script as ps

    parser = argparse.ArgumentParser()
    parser.add_argument("--job", choices=("digits", "regression", "gpt"), required=True)
    parser.add_argument("--optimizer", choices=("sgd", "adamw", "own"), required=True)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()

    run = ps.start()
    torch.manual_seed(args.seed)
    data, model, loss_of = _script_job(args.job)
    loader = run.shard(DataLoader(data, batch_size=args.batch_size, shuffle=True),
                       seed=args.seed)
    optimizer = _script_optimizer(args.optimizer, model.parameters(), args.lr)
    model, optimizer = run.setup(model, optimizer)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    for step, batch in enumerate(loader, 1):
        optimizer.zero_grad()
        with autocast:
            loss = loss_of(model, batch)
        run.backward(loss)
        optimizer.step()
        if step == args.steps:
            break


if __name__ == "__main__":
    main()
