"""A user's task that fails only inside a worker, after the pre-start check passed: one line
naming the rank, no traceback on the terminal, the run recorded as failed."""
import textwrap

import pytest

from helpers import Finished, train_captured

pytestmark = pytest.mark.slow  # every test here starts worker processes

TASK = """
import sys
import torch
import torch.distributed as dist
from torch import nn
from parascale.tasks import Task

class Points(torch.utils.data.Dataset):
    def __init__(self, n):
        self.x, self.y = torch.randn(n, 4), torch.randn(n, 1)
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return self.x[i], self.y[i]

def mse(net, batch):
    x, y = batch
    return nn.functional.mse_loss(net(x), y)

def make(**changes):
    return Task(**{"train_data": Points(32), "eval_data": Points(8),
                   "model": lambda: nn.Linear(4, 1), "loss": mse, **changes})
"""


def _failed(tmp_path, capfd, body: str, name: str) -> tuple[Finished, dict]:
    """``parascale train --task`` of ``body`` on 2 workers, from ``tmp_path`` where the task's
    file is, in this process (its fork server is warm): the exit code, output and record."""
    (tmp_path / f"{name}.py").write_text(TASK + textwrap.dedent(body))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        return train_captured(tmp_path, capfd, "--task", f"{name}:task", "--workers", "2",
                              "--steps", "2", "--batch-size", "4")


def test_sys_exit_in_a_workers_loss_is_one_line_naming_the_rank(tmp_path, capfd):
    # the check in the launcher has no process group: only the workers' rank 0 exits
    proc, record = _failed(tmp_path, capfd, """
        def leaves(net, batch):
            if dist.is_initialized() and dist.get_rank() == 0:
                sys.exit(0)
            return mse(net, batch)

        def task():
            return make(loss=leaves)
        """, "exits")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("parascale: failed: rank 0 failed:"), proc.stderr
    assert "sys.exit(0)" in last and "exits.py:" in last, last
    assert record["status"] == "failed" and "sys.exit(0)" in record["reason"]
