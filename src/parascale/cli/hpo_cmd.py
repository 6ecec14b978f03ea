"""``parascale hpo``: a parallel hyperparameter search on Optuna, trials on disjoint devices."""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from parascale.checks import path_option
from parascale.digits import ascii_float, ascii_int
from parascale.errors import KnownFailure, UsageError

DESCRIPTION = """\
Search hyperparameters with Optuna: several trials at once, each a training run in a process of
its own on its own devices (--devices-per-trial of them: CPU cores pinned by affinity, or GPUs
from --gpus), data-parallel over them. Concurrency = devices / devices per trial.

Every trial holds out --val-fraction of the training set (the same samples for every trial) and
is judged on it alone: its best validation accuracy, or its time to reach --target on it. The
test set is evaluated once, after the search, for the best trial only. Trials that fall behind
are pruned after an epoch (median rule, or successive halving).

The study lives in a database (default: a SQLite file in --out; any URL Optuna accepts, such as
PostgreSQL, to share one search between machines). Run the same command again to resume an
interrupted search (trials it left running are queued again; none that finished runs twice), or
with a larger --trials to extend it.

Writes OUT/trials/NNNN/ (each trial's record.json and log.txt; model.pt of the best only),
OUT/trials.csv, OUT/best.json and OUT/plots/. One --out holds one study (OUT/hpo-study.json
names it): another study needs another --out.
"""

EXAMPLES = """\
examples:
  parascale hpo --model resnet20 --dataset digits --epochs 8 --trials 20 --out hpo/digits \\
      --param lr=0.01:0.8:log --param batch_size=16,32,64,128 --param momentum=0.8:0.99
  parascale hpo --space space.yaml --objective tta --target 0.95 --devices-per-trial 2 ...
  parascale hpo --gpus 0,1,2,3 --devices-per-trial 1 --storage postgresql://host/db ...

space.yaml:
  lr: 0.01:0.8:log
  batch_size: [16, 32, 64, 128]
  lr_scaling: [none, linear]
  sync: [allreduce, local-sgd]
  period: 2:16            # drawn only when sync is local-sgd
"""

#: training options the search decides or that a search does not take
NOT_TRAIN_OPTIONS = {"out", "workers", "port", "evaluate_test", "stop_at_target",
                     "target_accuracy", "save_model", "threads", "oversubscribe", "val_fraction"}


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from parascale.cli.options import add_train_options
    from parascale.training.loop.pruning import PRUNERS

    parser = subparsers.add_parser(
        "hpo", help="search hyperparameters with Optuna, several trials at once",
        description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("the search")
    group.add_argument("--out", required=True, metavar="DIR", type=path_option("--out"),
                       help="folder of the trials, the table, the plots (and the SQLite study)")
    group.add_argument("--param", action="append", default=[], metavar="NAME=SPEC",
                       help="a searched option: A,B,C (choices), LOW:HIGH or LOW:HIGH:log; "
                       "repeat for each")
    group.add_argument("--space", metavar="FILE", help="searched options from a YAML/JSON/TOML "
                       "file (see the example below)")
    group.add_argument("--trials", type=ascii_int, default=20, metavar="N",
                       help="finished trials the study should have (default 20)")
    group.add_argument("--devices-per-trial", type=ascii_int, default=1, metavar="K",
                       help="devices (cores or GPUs) each trial trains on (default 1)")
    group.add_argument("--objective", metavar="NAME",
                       help="accuracy: maximise the best validation accuracy; tta: minimise "
                       "the time to --target validation accuracy; or any metric of the task "
                       "(loss, or a --task's own), best validation value in its direction "
                       "(default accuracy)")
    group.add_argument("--target", type=ascii_float, metavar="T",
                       help="the validation accuracy of --objective tta, e.g. 0.95")
    group.add_argument("--pruner", choices=PRUNERS, default="median",
                       help="stop trials that fall behind after an epoch (default median)")
    group.add_argument("--val-fraction", type=ascii_float, default=0.2, metavar="F",
                       help="of the training set, held out to judge trials (default 0.2)")
    group.add_argument("--storage", metavar="URL",
                       help="Optuna storage (default sqlite:///OUT/hpo.db)")
    group.add_argument("--study-name", default="parascale", metavar="NAME",
                       help="the study in that storage (default parascale)")
    add_train_options(parser, exclude=NOT_TRAIN_OPTIONS)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from parascale.cli.options import config_from_args
    from parascale.config import TrainConfig
    from parascale.files import check_writable_folder
    from parascale import studydb as storage
    from parascale.hpo import space
    from parascale.hpo.slots import make_slots
    from parascale.training import preflight

    fixed = config_from_args(args)
    fixed.pop("gpus", None)
    params = space.merge([space.parse_param(p) for p in args.param],
                         space.load_space(args.space) if args.space else [])
    if args.trials < 1:
        raise UsageError(f"--trials must be a positive integer, got {args.trials}")
    if args.objective == "tta" and args.target is None:
        raise UsageError("--objective tta needs --target, the validation accuracy to reach "
                         "(e.g. --target 0.95)")
    if args.target is not None and not 0 < args.target <= 1:
        raise UsageError(f"--target is a fraction in (0, 1], got {args.target}")
    if args.objective != "tta" and args.target is not None:
        raise UsageError("--target belongs to --objective tta; leave it out")
    fixed.update({"val_fraction": args.val_fraction, "evaluate_test": False})
    from parascale.hpo import objective as objectives
    from parascale.tasks import directions

    args.objective, maximize = objectives.resolve(args.objective,
                                                  directions(TrainConfig.from_dict(fixed)))
    if args.target is not None:
        fixed.update({"target_accuracy": args.target, "stop_at_target": True})
    slots = make_slots(args.devices_per_trial, getattr(args, "gpus", None))
    if slots[0].gpus:  # in hpo's own words: it has no --workers
        from parascale.runtime import resolve_device_type

        resolve_device_type("cuda", slots[0].gpus, "leave out --gpus to run the trials on CPU "
                            "cores (--devices-per-trial each)")
    out = Path(args.out).resolve()
    check_writable_folder(out)
    fixed["out"] = str(out)  # the folder, however it was typed (hpo/a/, ./hpo/a)
    url = storage.normal(args.storage) if args.storage else f"sqlite:///{out / 'hpo.db'}"
    where = {"gpus": list(slots[0].gpus)} if slots[0].gpus else \
        {"workers": args.devices_per_trial}
    memo: dict = {}  # each data set built once, each model probed once per input shape
    space.check(params, fixed, lambda cfg: preflight(TrainConfig.from_dict({**cfg, **where}),
                                                     args.devices_per_trial, memo))
    # Optuna and matplotlib (a second or more): once the input is known to be good
    from parascale.hpo import plots, results, search, study

    the_study = _open(out, url, args, study.identity(args.objective, args.target, params, fixed,
                                                     maximize), fixed.get("seed", 0))
    again = study.recover(the_study, url, lambda trial: search.draw(params, fixed, trial))
    labels = ", ".join(s.label() for s in slots)
    print(f"parascale hpo: study {args.study_name!r} in {storage.masked(url)}; {len(slots)} "
          f"trial(s) at once ({labels})", flush=True)
    for param in params:
        print(f"  {param.describe()}", flush=True)
    if again:
        print(f"  trial(s) {', '.join(map(str, again))} were left running by a search that "
              "ended: queued again", flush=True)
    found = search.Search(the_study, url, args.study_name, params, fixed, args.objective,
                          args.target, args.pruner, out, args.trials, maximize)
    search.run(found, slots)
    table = results.rows(found)
    print(results.format_table(table, found))
    # the search's results first, each file whole: the test evaluation runs the user's code
    # once more, and its failure must not lose them
    written = [f"table: {results.write_csv(table, out / 'trials.csv')}"]
    best = results.best_trial(found)
    if best is not None:
        written.append(f"best: {results.write_best(best, out / 'best.json')}")
    if plots.write(table, args.objective, out / "plots", maximize):
        written.append(f"plots: {out / 'plots'}")
    best = results.test_best(found)
    if best is not None:  # with its test figures, or why there are none
        results.write_csv(results.rows(found), out / "trials.csv")
        results.write_best(best, out / "best.json")
    print("\n".join(results.best_lines(best, found)))
    print("; ".join(written), flush=True)
    sys.stdout.flush()
    if best is not None and best.get("failed"):
        raise KnownFailure(f"the test evaluation of the best trial, {best['trial']}, failed "
                           f"({best['why'].removeprefix('its test evaluation failed: ')}); the "
                           f"search's results are kept in {out / 'trials.csv'} and "
                           f"{out / 'best.json'}: run the command again to evaluate it again")
    return 0


def _open(out: Path, url: str, args: argparse.Namespace, identity: dict, seed: int):
    """The study, with ``out`` claimed for it; on a refusal a folder made here is removed."""
    from parascale import studydb as storage
    from parascale.hpo import study

    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        # one lock over the claim of --out and the creation of the study: two commands started
        # at once on a new folder cannot both find it unclaimed, or both create the tables
        with storage.locked(out, storage.folder_of(url)):
            unclaimed = study.check_claim(out, url, args.study_name)
            found = study.open_study(url, args.study_name, identity, seed, args.pruner,
                                     "another --out" + (" and --study-name" if args.storage
                                                        else ""))
            if unclaimed:
                study.claim(out, url, args.study_name, found)
        return found
    except UsageError:
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty: a concurrent command's results stay
        raise
