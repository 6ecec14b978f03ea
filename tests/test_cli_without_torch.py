"""The command line answers without importing torch (issue 34), nor matplotlib or Optuna:
every command's --help, and the usage errors that need no tensor (unknown names, bad numbers,
bad combinations, bad paths, a study file with a bad key, a predict out of range), each the same
one line as ever. Checked in fresh interpreters, so these tests start processes; nothing here is
timed (benchmarks/cli_latency.py times the real commands)."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

HELP = [["--help"], ["--version"], ["train", "--help"], ["run", "--help"], ["bench", "--help"],
        ["demo", "--help"], ["report", "--help"], ["comm", "--help"], ["find-batch", "--help"],
        ["hpo", "--help"], ["predict", "--help"], ["slurm", "--help"],
        ["slurm", "train", "--help"], ["slurm", "bench", "--help"], ["slurm", "run", "--help"],
        ["slurm", "status", "--help"], ["advise", "--help"]]

#: (command line, words of its one error line): the first thing wrong needs no tensor
USAGE_ERRORS = [
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["train", "--model", "nosuch"], "unknown model 'nosuch'; parascale's models are mlp"),
    (["train", "--model", "resnet2"], "(did you mean 'resnet20'?)"),
    (["train", "--dataset", "nosuch"], "unknown dataset 'nosuch'; valid datasets: synthetic"),
    (["train", "--sync", "nosuch"], "unknown --sync 'nosuch'"),
    (["train", "--task", "no_such_module:task"], "module 'no_such_module' not found"),
    (["train", "--lr", "-1"], "--lr must be in [1e-10, 10000], got -1"),
    (["train", "--lr", "abc"], "argument --lr: expected a number in ASCII digits"),
    (["train", "--epochs", "2", "--steps", "1"], "give --epochs or --steps, not both"),
    (["train", "--workers", "3", "--global-batch", "32"], "global batch 32 does not divide"),
    (["train", "--sync", "local-sgd", "--compression", "fp16"], "belongs to --sync allreduce"),
    (["train", "--backend", "nccl", "--workers", "2"], "--backend nccl needs CUDA devices"),
    (["train", "--out", "/proc/x"], "--out /proc/x: cannot create a folder in /proc"),
    (["train", "--dataset", "cifar10"], "cifar10 needs --data-dir"),
    (["train", "--dataset", "mnist", "--data-dir", "/no/such/folder"], "does not exist"),
    (["train", "--dataset", "imagefolder"], "imagefolder needs --data-dir"),
    (["train", "--dataset", "imagefolder", "--data-dir", "script.py"], "is a file, not a folder"),
    (["run", "no_such_script.py"], "no such script: no_such_script.py"),
    (["run", "--workers", "0", "script.py"], "--workers must be a positive int, got 0"),
    (["run", "--sync", "nosuch", "script.py"], "unknown --sync 'nosuch'"),
    (["bench", "--model", "nosuch", "--dry-run"], "unknown model 'nosuch'"),
    (["bench", "-V", "nosuch=1,2", "--dry-run"], "unknown parameter 'nosuch'"),
    (["bench", "--config", "bad-study.yaml", "--dry-run"], "has unknown key(s) parametres"),
    (["bench", "--out", "/proc/x", "--dry-run"], "--out /proc/x: cannot create a folder"),
    (["demo", "--out", "/proc/x"], "--out /proc/x: cannot create a folder"),
    (["find-batch", "--model", "nosuch"], "unknown model 'nosuch'"),
    (["find-batch", "--model", "mlp", "--dataset", "nosuch"], "unknown dataset 'nosuch'"),
    (["hpo", "--out", "hpo", "--param", "lrr=0.1:0.2"], "unknown option 'lrr'; did you mean lr?"),
    (["hpo", "--out", "hpo", "--space", "bad-space.yaml"], "unknown option 'lrr'"),
    (["hpo", "--out", "hpo", "--param", "lr=0.1:0.2", "--model", "nosuch"],
     "unknown model 'nosuch'"),
    (["slurm", "train", "--model", "nosuch", "--dry-run"], "unknown model 'nosuch'"),
    (["slurm", "bench", "--model", "nosuch", "--dry-run"], "unknown model 'nosuch'"),
    (["slurm", "status", "no-such-study"], "study folder no-such-study does not exist"),
    (["report", "no-such-study"], "no-such-study does not exist"),
    (["comm", "--sizes", "1Q"], "--sizes: cannot read '1Q'"),
    (["predict", "--params", "1M", "--interconnect", "pcie", "--period", "0", "x"],
     "--period must be a whole number from 1 to 1e+07, got 0"),
    (["predict", "--params", "1M", "--device-memory", "-1"],
     "--device-memory must be a positive number of GiB"),
    (["advise", "--model", "nosuch", "--target-accuracy", "0.9"], "unknown model 'nosuch'"),
    (["advise", "--workers", "2", "--nodes", "2", "--gpus-per-node", "8",
      "--target-accuracy", "0.9"], "contradict each other"),
    (["advise", "--target-metric", "bleu", "--target-value", "2"],
     "'bleu' is not a metric of this task"),
    (["advise", "--model", "mlp"], "give the goal"),
]

#: what takes seconds to import: torch, and the plots' and the search's libraries
HEAVY = ["torch", "matplotlib", "optuna"]

#: runs each command line in turn in this interpreter; after each, which of HEAVY are imported
RUN_ALL = """
import contextlib, io, json, sys
from parascale.cli.main import main
args, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for argv in args:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    print(json.dumps({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue(),
                      "imported": [name for name in heavy if name in sys.modules]}))
"""


def run_all(folder, commands: list[list[str]]) -> list[dict]:
    (folder / "bad-study.yaml").write_text("parametres:\n  lr: 0.1\n")
    (folder / "bad-space.yaml").write_text("lrr: [0.1, 0.2]\n")
    (folder / "script.py").write_text("print('never run')\n")
    done = subprocess.run([sys.executable, "-c", RUN_ALL, json.dumps(commands),
                           json.dumps(HEAVY)], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def first_importing(results: list[dict]) -> tuple[str, list[str]] | None:
    """The first command line after which one of HEAVY was imported, and which (every later
    command line has it too)."""
    return next(((" ".join(r["argv"]), r["imported"]) for r in results if r["imported"]), None)


def test_every_help_is_printed_without_importing_torch(tmp_path):
    results = run_all(tmp_path, HELP)
    assert first_importing(results) is None
    for result in results:
        assert result["code"] == 0 and result["out"].startswith(("usage: ", "parascale ")), result


def test_usage_errors_that_need_no_tensor_are_said_without_importing_torch(tmp_path):
    results = run_all(tmp_path, [argv for argv, _ in USAGE_ERRORS])
    assert first_importing(results) is None
    for result, (argv, words) in zip(results, USAGE_ERRORS):
        lines = result["err"].strip().splitlines()
        assert result["code"] == 2, result
        assert len(lines) == 1 and lines[0].startswith("parascale: error: "), result
        assert words in lines[0], (argv, lines[0])
    assert not (tmp_path / "hpo").exists()


def test_a_check_that_needs_a_tensor_comes_after_them(tmp_path):
    """The data's size is known once the data is built (torch): a batch larger than it is
    refused then, in the same words as before."""
    results = run_all(tmp_path, [["train", "--workers", "2", "--global-batch", "4096"]])
    assert "torch" in results[0]["imported"] and results[0]["code"] == 2
    assert "larger than the 1437 training samples of digits" in results[0]["err"]


@pytest.mark.parametrize("argv", [["train", "--help"], ["train", "--model", "nosuch"],
                                  ["hpo", "--help"], ["train", "--lr", "-1"]])
def test_the_real_command_answers_where_torch_cannot_be_imported(tmp_path, argv):
    """``python -m parascale`` as a user starts it (the fork server started first, the quick
    exit), in an interpreter whose ``import torch`` fails: it answers as ever."""
    block = ("import runpy, sys\nsys.modules['torch'] = None  # import torch raises\n"
             "sys.argv = ['parascale', *sys.argv[1:]]\n"
             "runpy.run_module('parascale', run_name='__main__', alter_sys=True)\n")
    done = subprocess.run([sys.executable, "-c", block, *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    if "--help" in argv:
        assert done.returncode == 0 and done.stdout.startswith("usage: parascale"), done.stderr
    else:
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
