"""parascale slurm without a cluster: the job scripts it renders, the quoting of hostile values,
the task-count check of an srun world, and bad input as one line with nothing written."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from conftest import one_line_error
from helpers import srun_words

from parascale.cli.main import main
from parascale.cluster import scheduler
from parascale.cluster.script import SlurmOptions, layout
from parascale.errors import UsageError
from parascale.runtime.world import check_tasks, slurm_port


@pytest.fixture(autouse=True)
def no_sinfo(monkeypatch):
    """The fast tier starts no process: plan studies against this machine's cores."""
    monkeypatch.setattr(scheduler, "cpus_per_node", lambda partition: None)


def sbatch_lines(script: str) -> dict[str, str]:
    found = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = shlex.split(line[len("#SBATCH "):])[0].partition("=")
            found[key] = value
    return found


def test_train_script_runs_one_task_per_worker_with_trains_own_options(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["slurm", "train", "--workers", "4", "--nodes", "2", "--time", "1:30:00",
                 "--partition", "gpu_a", "--account", "proj-1", "--model", "mlp", "--steps", "7",
                 "--global-batch", "64", "--lr", "0.1", "--val-fraction", "0.2",
                 "--no-evaluate-test", "--setup", "module load python/3.11", "--out", str(out), "--dry-run"])
    script = capsys.readouterr().out
    assert code == 0 and not out.exists() and list(tmp_path.iterdir()) == []
    sbatch = sbatch_lines(script)
    assert sbatch["--nodes"] == "2" and sbatch["--ntasks-per-node"] == "2"
    assert sbatch["--time"] == "1:30:00" and sbatch["--partition"] == "gpu_a"
    assert sbatch["--account"] == "proj-1" and sbatch["--output"] == f"{out}-slurm-%j.out"
    lines = script.splitlines()
    assert "module load python/3.11" in lines  # the set-up, as given, before training
    assert lines.index("module load python/3.11") < next(
        i for i, line in enumerate(lines) if line.startswith("srun "))
    words = srun_words(script)
    assert words[:3] == ["srun", "--kill-on-bad-exit=1", "--cpus-per-task=1"]
    train = words[words.index("train") + 1:]
    assert train == ["--model", "mlp", "--workers", "4", "--threads", "1", "--global-batch",
                     "64", "--steps", "7", "--lr", "0.1", "--val-fraction", "0.2",
                     "--no-evaluate-test", "--out", str(out)]
    # two nodes: the store on the first node's address, a port every task derives alike
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    assert "export MASTER_PORT=$((15000 + SLURM_JOB_ID % 15000))" in lines
    assert slurm_port(15006) == 15006 and slurm_port(6) == 15006 and slurm_port(14999) == 29999


def test_one_node_job_listens_on_loopback_and_gpus_go_one_task_each(tmp_path, capsys):
    assert main(["slurm", "train", "--gpus-per-node", "4", "--steps", "2",
                 "--out", str(tmp_path / "g"), "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "export MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo" in script.splitlines()
    assert sbatch_lines(script)["--gpus-per-node"] == "4"
    assert sbatch_lines(script)["--ntasks-per-node"] == "4"
    train = srun_words(script)
    assert train[train.index("--device") + 1] == "cuda" and "--gpus" not in train


@pytest.mark.parametrize("hostile", [
    "run $(touch /tmp/pwned) `id`; rm -rf ~",
    "it's \"quoted\" and ${HOME} & more | cat > x",
    "per%cent %j 100%",
])
def test_hostile_values_reach_the_job_as_they_were_typed(tmp_path, capsys, hostile):
    out = tmp_path / hostile
    setup = f"echo {shlex.quote(hostile)}"
    assert main(["slurm", "train", "--steps", "2", "--out", str(out), "--setup", setup,
                 "--dry-run"]) == 0
    script = capsys.readouterr().out
    words = srun_words(script)
    assert words[-2:] == ["--out", str(out)]  # one word, exactly the path
    # Slurm's file name pattern: the path's own % doubled, then %j
    assert sbatch_lines(script)["--output"] == str(out).replace("%", "%%") + "-slurm-%j.out"
    assert setup in script.splitlines()  # a set-up line is the user's shell, one line
    for line in script.splitlines():  # the path shows only quoted or inside a comment
        if hostile in line and not line.startswith("#"):
            assert line in (setup,) or "'" in line


@pytest.mark.parametrize("extra, message", [
    (["--nodes", "0"], "--nodes must be 1 or more, got 0"),
    (["--time", "90min"], "--time '90min' is not a Slurm time limit"),
    (["--time", "1:00:00\n#SBATCH --x"], "is not a Slurm time limit"),
    (["--setup", "module load a\nrm -rf ~"], "one shell line per --setup"),
    (["--setup", "echo a\0b"], "one shell line per --setup"),
    (["--partition", "a;b"], "--partition 'a;b': expected a name"),
    (["--gpus", "0,1"], "on Slurm ask for --gpus-per-node"),
    (["--workers", "3", "--nodes", "2"], "3 workers cannot be spread evenly over 2 nodes"),
    (["--cpus-per-task", "0"], "--cpus-per-task must be 1 or more"),
    (["--wait"], "--wait waits for submitted jobs"),
    (["--batch-size", "0"], "batch"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    code = main(["slurm", "train", "--steps", "2", "--out", str(out), "--dry-run", *extra])
    line = one_line_error(capsys)
    assert code == 2 and message in line, line
    assert list(tmp_path.iterdir()) == []


def test_status_of_a_folder_that_is_not_a_study_is_one_line(tmp_path, capsys):
    assert main(["slurm", "status", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in one_line_error(capsys)
    assert main(["slurm", "status", str(tmp_path)]) == 2
    assert "not a study folder (no plan.json)" in one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_study_dry_run_prints_one_job_per_configuration_that_files_into_the_study(
        tmp_path, capsys):
    study = tmp_path / "study"
    code = main(["slurm", "bench", "--workers", "1,2", "--scaling", "weak", "--batch-size", "16",
                 "--epochs", "1", "--time", "10", "--out", str(study), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and not study.exists()
    scripts = out.split("# ---- ")[1:]
    assert len(scripts) == 2
    for script, workers in zip(scripts, (1, 2)):
        folder = Path(script.split(" ----")[0]).stem
        assert folder.startswith(f"workers-{workers}__")
        assert sbatch_lines(script)["--ntasks-per-node"] == str(workers)
        words = srun_words(script)
        assert words[-2:] == ["--out", str(study / ".running" / folder)]
        assert words[words.index("--workers") + 1] == str(workers)
        assert "--no-save-model" in words  # bench keeps records only
        filing = [line for line in script.splitlines() if "parascale.cluster.filing" in line]
        assert shlex.split(filing[0])[-4:] == [str(study), folder, "$SLURM_JOB_ID", "$code"]
    assert "dry run: nothing was written or submitted" in out


def test_a_study_may_ask_for_more_workers_than_this_machine_has(tmp_path, capsys):
    # 16 workers on this 2-core machine would be refused as oversubscribed: the nodes' cores
    # count, which Slurm hands out
    code = main(["slurm", "bench", "--workers", "1,4,16", "--nodes", "8", "--scaling", "weak",
                 "--batch-size", "8", "--steps", "2", "--out", str(tmp_path / "s"), "--dry-run"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    scripts = captured.out.split("# ---- ")[1:]
    assert [sbatch_lines(s)["--nodes"] for s in scripts] == ["1", "4", "8"]
    assert all("--oversubscribe" not in srun_words(s) for s in scripts)
    assert "oversubscribe" not in captured.out.splitlines()[0]  # the plan as the user gave it


def test_study_bad_input_is_one_line(tmp_path, capsys):
    study = tmp_path / "s"
    assert main(["slurm", "bench", "--workers", "1,2", "--out", str(study), "--epochs", "1",
                 "--quiet-machine", "--dry-run"]) == 2
    assert "--quiet-machine" in one_line_error(capsys)
    assert main(["slurm", "bench", "--workers", "1,2", "--out", str(study), "--epochs", "1"]) == 2
    assert "give --dry-run" in one_line_error(capsys)
    assert not study.exists()


def test_layout_fills_nodes_with_one_task_per_gpu():
    assert layout(8, SlurmOptions(nodes=2, gpus_per_node=4)) == (2, 4)
    assert layout(4, SlurmOptions(nodes=2, gpus_per_node=4)) == (1, 4)
    assert layout(None, SlurmOptions(nodes=3, gpus_per_node=2)) == (3, 2)
    assert layout(1, SlurmOptions(nodes=4)) == (1, 1)
    with pytest.raises(UsageError, match="do not fill whole nodes of 4 GPUs"):
        layout(6, SlurmOptions(nodes=2, gpus_per_node=4))
    with pytest.raises(UsageError, match="need 3 nodes of 4 GPUs, but --nodes is 2"):
        layout(12, SlurmOptions(nodes=2, gpus_per_node=4))


SRUN = {"SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "1", "SLURMD_NODENAME": "n2"}


def test_task_count_is_checked_against_nodes_times_tasks_per_node():
    check_tasks(SRUN, "cpu", 0)  # 4 = 2 x 2
    check_tasks(SRUN, "cuda", 2)
    with pytest.raises(UsageError, match=r"srun started 3 tasks, but the job has 2 node\(s\) x "
                                         r"2 tasks per node = 4"):
        check_tasks({**SRUN, "SLURM_NTASKS": "3"}, "cpu", 0)
    with pytest.raises(UsageError, match="srun runs 2 tasks on node n2, which shows 1 GPU"):
        check_tasks(SRUN, "cuda", 1)
    # uneven nodes: '3,1' puts 3 tasks on node 0
    with pytest.raises(UsageError, match="srun runs 3 tasks on node"):
        check_tasks({"SLURM_NTASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "3,1",
                     "SLURM_NODEID": "0"}, "cuda", 2)


def test_a_killed_job_is_read_from_the_line_slurmstepd_writes(tmp_path):
    output = tmp_path / "job.out"
    output.write_text("epoch 1/3 ...\nslurmstepd: error: *** JOB 42 ON vm CANCELLED AT "
                      "2026-11-24T20:31:02 DUE TO TIME LIMIT ***\n")
    state = scheduler._from_output("42", output)
    assert state.state == "TIMEOUT" and "DUE TO TIME LIMIT" in state.reason
    output.write_text("slurmstepd: error: *** JOB 43 ON vm CANCELLED AT 2026-11-24T20:31:02 ***\n")
    assert scheduler._from_output("43", output).state == "CANCELLED"
    assert scheduler._from_output("44", output) is None  # another job's line


def test_a_failed_jobs_reason_names_the_task_that_failed_first(tmp_path):
    from parascale.cluster.filing import last_error

    output = tmp_path / "job.out"
    output.write_text(
        "parascale: smallcnn on digits, 2 worker(s)\n"
        "[rank1]: Traceback (most recent call last):\n"
        "[rank1]:   File \"loop.py\", line 213, in _step\n"
        "[rank1]: RuntimeError: injected fault on rank 1 at step 2\n"
        "[rank0]: RuntimeError: Connection closed by peer\n"
        "srun: error: vm: task 1: Exited with exit code 1\n"
        "srun: error: vm: task 0: Terminated\n")
    assert last_error(output) == ("task 1: Exited with exit code 1: RuntimeError: injected "
                                  "fault on rank 1 at step 2")
    output.write_text("parascale: error: srun started 3 tasks, but ...\n"
                      "srun: error: vm: task 0: Exited with exit code 2\n")
    assert last_error(output) == "parascale: error: srun started 3 tasks, but ..."
    assert last_error(tmp_path / "none.out") is None


def test_rank_0_of_an_srun_world_hosts_the_store_on_master_addr_alone(monkeypatch):
    import datetime
    import socket

    import psutil

    from parascale.runtime.world import _slurm_store

    with socket.socket() as probe:  # a free port, as the job id would give one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    store = _slurm_store(0, 1, datetime.timedelta(seconds=10))
    try:
        listening = [c.laddr for c in psutil.Process().net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert listening and {a.ip for a in listening} == {"127.0.0.1"}  # not 0.0.0.0 or ::
        store.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        del store


def test_train_options_written_into_the_script_read_back_as_the_same_configuration():
    from parascale.cli.main import build_parser
    from parascale.cli.options import config_from_args
    from parascale.cluster.script import train_flags

    given = {"model": "mlp", "dataset": "synthetic", "synthetic_shape": (1, 8, 8),
             "workers": 4, "threads": 2, "global_batch": 64, "steps": 3, "lr": 0.1,
             "lr_milestones": (2, 5), "augment": True, "evaluate_test": False,
             "val_fraction": 0.25, "learners": "auto", "sync": "allreduce",
             "sync_options": {"learner_engine": "1", "b": 2.5, "c": [1, "x"], "d": None,
                              "e": True, "f": "text"}}
    flags = train_flags(given)
    args = build_parser(["train"]).parse_args(["train", *flags])
    assert config_from_args(args) == given


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\0b", "a\x1b[2Jb", "a\u2028b", "a\x85b"])
@pytest.mark.parametrize("command", ["train", "bench"])
def test_a_control_character_in_any_value_is_refused_by_its_option(tmp_path, capsys, value,
                                                                    command):
    # no quoting protects a newline in an #SBATCH line: the rest became a command of its own
    extra = ["--workers", "1"] if command == "bench" else []
    for option, given in (("--out", str(tmp_path / value)),
                          ("--data-dir", str(tmp_path / value))):
        args = ["slurm", command, "--steps", "2", "--time", "5", "--dataset", "cifar10",
                "--out", str(tmp_path / "run"), *extra, option, given, "--dry-run"]
        assert main(args) == 2
        line = one_line_error(capsys)
        assert line.startswith(f"parascale: error: {option} {given!r} holds {value[1]!r}"), line
    assert list(tmp_path.iterdir()) == []


def test_a_working_folder_with_a_newline_cannot_reach_the_script_either(tmp_path, capsys,
                                                                        monkeypatch):
    # --out is typed plain, but made absolute from where parascale runs
    here = tmp_path / "a\ntouch x"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["slurm", "train", "--steps", "2", "--out", "run", "--dry-run"]) == 2
    assert "holds '\\n', which a Slurm job script cannot carry" in one_line_error(capsys)
    assert list(here.iterdir()) == []


def test_a_backslash_in_the_output_path_is_refused(tmp_path, capsys):
    # Slurm expands no %j in a file name pattern with a backslash, and drops the backslash
    out = tmp_path / "a\\b"
    assert main(["slurm", "train", "--steps", "2", "--out", str(out), "--dry-run"]) == 2
    assert "holding a backslash; choose an --out without one" in one_line_error(capsys)


@pytest.mark.parametrize("value, directive", [
    ("plain/path-1_2.out", "--output=plain/path-1_2.out"),
    ("a b#c", '"--output=a b#c"'),
    ('q"uo\'te', '"--output=q\\"uo\'te"'),
    ("$(x) `y` é", '"--output=$(x) `y` é"'),
])
def test_sbatch_values_are_quoted_for_sbatchs_own_parser(value, directive):
    from parascale.cluster.script import directive as quote

    assert quote(f"--output={value}") == directive
    assert shlex.split(quote(f"--output={value}")) == [f"--output={value}"]


def test_a_value_that_starts_with_a_dash_stays_the_options_value(tmp_path, capsys,
                                                                  monkeypatch):
    from parascale.cli.main import build_parser
    from parascale.cli.options import config_from_args

    monkeypatch.chdir(tmp_path)
    assert main(["slurm", "train", "--steps", "2", "--dataset", "cifar10", "--data-dir=-d",
                 "--out=-r", "--dry-run"]) == 0
    words = srun_words(capsys.readouterr().out)
    train = words[words.index("train") + 1:]
    assert "--data-dir=-d" in train and train[-2:] == ["--out", str(tmp_path / "-r")]
    assert config_from_args(build_parser(["train"]).parse_args(["train", *train]))[
        "data_dir"] == "-d"


@pytest.mark.parametrize("value, message", [
    ("\uff15", "--time '\uff15' is not a Slurm time limit"),  # a fullwidth 5: \d took it
    ("1:\uff13\uff10", "is not a Slurm time limit"),
    ("99999999999999999999", "is longer than 365 days"),  # Slurm ran it unlimited
    ("366-00:00:00", "is longer than 365 days"),
    ("0", "is zero, which Slurm reads as no limit"),
    ("0-0:0:0", "is zero"),
    ("1:2:3:4", "is not a Slurm time limit"),
    ("-5", "is not a Slurm time limit"),
])
def test_time_limit_is_one_of_sbatchs_forms_in_ascii_digits_and_bounded(tmp_path, capsys,
                                                                         value, message):
    assert main(["slurm", "train", "--steps", "2", "--out", str(tmp_path / "r"), "--time",
                 value, "--dry-run"]) == 2
    assert message in one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value, seconds", [
    ("30", 1800), ("0:30", 30), ("1:30:00", 5400), ("2-12", 216000), ("2-12:30", 217800),
    ("2-12:30:15", 217815), ("365-00:00:00", 365 * 86400)])
def test_time_limit_forms_sbatch_accepts_are_accepted(value, seconds):
    from parascale.cluster.script import time_limit

    assert time_limit(value) == seconds


def test_a_data_folder_only_the_nodes_mount_renders_with_one_warning(tmp_path, capsys):
    data = tmp_path / "scratch" / "cifar10"  # not on this machine
    assert main(["slurm", "train", "--steps", "2", "--dataset", "cifar10", "--data-dir",
                 str(data), "--out", str(tmp_path / "r"), "--dry-run"]) == 0
    captured = capsys.readouterr()
    warning = captured.err.strip().splitlines()
    assert warning == [(f"parascale: warning: --data-dir {data} is not on this machine; the "
                        "job reads it on the nodes (and says so if it is missing there too)")]
    words = srun_words(captured.out)
    assert words[words.index("--data-dir") + 1] == str(data)
    assert list(tmp_path.iterdir()) == []
    # a folder that is here is still checked here
    data.parent.mkdir()
    data.write_text("")
    assert main(["slurm", "train", "--steps", "2", "--dataset", "cifar10", "--data-dir",
                 str(data), "--out", str(tmp_path / "r"), "--dry-run"]) == 2
    assert "is a file, not a folder" in one_line_error(capsys)


def test_status_of_a_file_says_it_is_not_a_folder(tmp_path, capsys):
    file = tmp_path / "study.txt"
    file.write_text("")
    assert main(["slurm", "status", str(file)]) == 2
    line = one_line_error(capsys)
    assert f"{file} is a file, not a study folder" in line and "does not exist" not in line


@pytest.mark.parametrize("option", ["--nodes", "--gpus-per-node", "--cpus-per-task"])
def test_slurm_counts_are_ascii_digits(tmp_path, capsys, option):
    assert main(["slurm", "train", "--steps", "2", "--out", str(tmp_path / "r"), option,
                 "\uff12", "--dry-run"]) == 2  # a fullwidth 2: int() reads it
    assert f"argument {option}: expected a whole number in ASCII digits, got '\uff12'" in \
        one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []
