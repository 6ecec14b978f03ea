"""--checkpoint-every, --keep, --resume and --max-restarts as the user meets them, in one process:
one line and exit code 2 for what cannot work, and the checks a resume makes before any worker
starts (the checkpoint's settings, an earlier run's checkpoints, the world size)."""
from __future__ import annotations

import pytest

import parascale
from conftest import run_state
from parascale.cli.main import main
from parascale.config import TrainConfig, checkpoint_interval
from parascale.errors import UsageError
from parascale.training.checkpoint import disk as checkpoint
from parascale.training.checkpoint import resume
from parascale.validation import validate


def refused(capsys, *args: str) -> str:
    code = main(["train", *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("parascale: error:"), lines
    return lines[0]


@pytest.mark.parametrize("args, words", [
    (["--checkpoint-every", "3x"], "--checkpoint-every is a number of steps (200) or of epochs "
                                   "(2e), got '3x'"),
    (["--checkpoint-every", "0"], "got 0"),
    (["--checkpoint-every", "e"], "got 'e'"),
    (["--checkpoint-every", "\uff12e"], "got '\uff12e'"),  # a fullwidth 2: isdigit, no count
    (["--max-restarts", "-1"], "--max-restarts must be 0 or more, got -1"),
    (["--keep", "0"], "--keep must be a positive integer (checkpoints kept), got 0"),
    (["--compression", "powersgd", "--checkpoint-every", "5"],
     "--compression powersgd keeps error feedback per DDP bucket"),
])
def test_bad_checkpoint_options_are_one_line(capsys, tmp_path, args, words):
    out = tmp_path / "run"
    assert words in refused(capsys, *args, "--out", str(out))
    assert not out.exists()


def test_resume_without_out_is_one_line(capsys):
    line = refused(capsys, "--resume")
    assert "--resume needs --out: the folder of the run to continue" in line


@pytest.mark.parametrize("option", [{"checkpoint_every": 5}, {"resume": True}])
def test_the_api_needs_a_folder_for_checkpoints(option):
    with pytest.raises(UsageError, match="needs --out: checkpoints live in DIR/checkpoints"):
        parascale.train(option)


def test_a_study_plans_checkpointing_configurations_without_their_folders():
    validate(TrainConfig.of(checkpoint_every="2e", max_restarts=2))  # bench gives out per run


@pytest.mark.parametrize("value, expected", [
    (None, None), (200, (200, "steps")), ("1e", (1, "epochs")), ("12E", (12, "epochs")),
])
def test_checkpoint_interval_reads_steps_and_epochs(value, expected):
    assert checkpoint_interval(value) == expected


def written(out, step: int = 6, **config) -> checkpoint.Found:
    cfg = TrainConfig.of(workers=2, out=str(out), checkpoint_every=3, **config)
    return checkpoint.save(checkpoint.folder_of(out), step, run_state(step, world_size=2),
                           {"epoch": 2, "world_size": 2, "config": cfg.to_dict()})


def test_a_fresh_run_does_not_mix_its_checkpoints_with_an_earlier_runs(tmp_path):
    written(tmp_path)
    cfg = TrainConfig.of(workers=2, out=str(tmp_path), checkpoint_every=3)
    with pytest.raises(UsageError, match=r"holds checkpoints of an earlier run \(the newest at "
                                         r"step 6\); continue it with --resume, or remove"):
        resume.refuse_fresh_start(cfg)
    with pytest.raises(UsageError, match="holds checkpoints of an earlier run"):  # none written
        resume.refuse_fresh_start(TrainConfig.of(workers=2, out=str(tmp_path)))
    resume.refuse_fresh_start(TrainConfig.of(workers=2, out=str(tmp_path), checkpoint_every=3,
                                             resume=True))


def test_resume_takes_the_newest_checkpoint_and_says_what_it_skipped(tmp_path):
    written(tmp_path, 3)
    newer = written(tmp_path, 6)
    newer.path.write_bytes(newer.path.read_bytes()[:50])
    said = []
    cfg = TrainConfig.of(workers=2, out=str(tmp_path), checkpoint_every=3, resume=True)
    choice = resume.first_choice(cfg, 2, 12, said.append)
    assert (choice.step, choice.by, choice.label) == (3, "resume", "checkpoints/step-00000003.pt")
    assert choice.skipped[0]["checkpoint"] == "checkpoints/step-00000006.pt"
    assert len(said) == 1 and "cannot be used" in said[0]


def test_resume_without_a_checkpoint_starts_from_the_beginning_and_says_so(tmp_path):
    said = []
    cfg = TrainConfig.of(workers=2, out=str(tmp_path), resume=True)
    assert resume.first_choice(cfg, 2, 12, said.append) is None
    assert said == [f"parascale: no checkpoint in {tmp_path}/checkpoints; starting from the "
                    "beginning"]


@pytest.mark.parametrize("change, size, steps, words", [
    ({"lr": 0.1}, 2, 12, "it was written with --lr 0.05 and this run gives 0.1"),
    ({"lr": 0.1, "seed": 4}, 2, 12, "(and 1 more setting(s))"),
    ({"sync": "local-sgd"}, 2, 12, "--sync allreduce and this run gives local-sgd"),
    ({}, 4, 12, "it was written by 2 workers and this run has 4"),
    ({}, 2, 5, "it is at step 6, past the 5 steps this run trains"),
])
def test_a_checkpoint_of_other_settings_is_refused_in_one_line(tmp_path, change, size, steps,
                                                                words):
    written(tmp_path)
    cfg = TrainConfig.of(workers=size, out=str(tmp_path), checkpoint_every=3, resume=True,
                         **change)
    with pytest.raises(UsageError) as refusal:
        resume.first_choice(cfg, size, steps, lambda line: None)
    message = str(refusal.value)
    assert "\n" not in message and words in message, message
    assert message.startswith("cannot continue from checkpoints/step-00000006.pt: ")


def test_where_and_how_long_a_run_goes_may_change_on_resume(tmp_path):
    written(tmp_path)
    # port is a setting compared with the checkpoint's, never bound: nothing listens here
    cfg = TrainConfig.of(workers=2, out=str(tmp_path / "."), resume=True, timeout=30.0, steps=40,
                         checkpoint_every="1e", keep=5, max_restarts=2, port=29500, threads=1)
    assert resume.first_choice(cfg, 2, 40, lambda line: None).step == 6


def test_a_fresh_run_without_checkpoints_into_a_folder_with_some_is_refused(tmp_path, capsys):
    """As the README says: with or without --checkpoint-every (an interrupted run's checkpoints
    are all it has; the command has most likely forgotten --resume)."""
    written(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    line = refused(capsys, "--workers", "1", "--dataset", "digits", "--model", "mlp",
                   "--steps", "2", "--out", str(tmp_path))
    assert "holds checkpoints of an earlier run (the newest at step 6)" in line
    assert "continue it with --resume, or remove" in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_checkpoint_at_the_end_of_an_epoch_cut_short_by_steps_is_not_continued_further(
        tmp_path):
    """A --steps 2 run ends after 2 of 5 steps of epoch 1 and checkpoints "at the start of epoch
    2": a --steps 4 resume would go on from epoch 2, leaving epoch 1 unfinished (and train
    nothing when the plan has one epoch), so it is refused; the same --steps is fine."""
    state = run_state(2, world_size=2)
    state["position"] = {"step": 2, "epoch": 2, "done": 0}
    state["progress"]["epochs"] = [{"epoch": 1, "steps": 2, "partial": True}]
    cfg = TrainConfig.of(workers=2, out=str(tmp_path), checkpoint_every=2, resume=True, steps=4)
    checkpoint.save(checkpoint.folder_of(tmp_path), 2, state,
                    {"epoch": 2, "world_size": 2, "config": cfg.to_dict()})
    with pytest.raises(UsageError) as refusal:
        resume.first_choice(cfg, 2, 4, lambda line: None)
    assert "its run ended after step 2, in the middle of epoch 1, and a longer run would " \
           "leave the rest of that epoch untrained" in str(refusal.value)
    assert resume.first_choice(cfg, 2, 2, lambda line: None).step == 2
