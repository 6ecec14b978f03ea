"""``parascale advise``: what to run (devices, batch, learning rate, strategy) and how long it
will take to reach the goal."""
from __future__ import annotations

import argparse
import sys

from parascale import sync
from parascale.checks import path_option
from parascale.cli.options import add_train_options, config_from_args
from parascale.cli.parsers import add_quiet_option
from parascale.digits import ascii_float, ascii_int, int_list

DESCRIPTION = """\
Tell what to run and how long it will take: given a job (as train takes it: --model/--dataset or
--task, the optimizer, its learning rate at its batch), the resources (up to --workers N CPU
workers here, or a cluster: --nodes, --gpus-per-node, --interconnect or --comm, --device-memory
and the device's speed) and a goal (a target on one of the task's metrics, or a budget of
samples, tokens or epochs), advise measures what it needs here, briefly (the job on 2 workers
to its target: the gradient noise scale and the steps at the job's batch; step times at a few
batches; the link), searches devices, per-device batch, accumulation, strategy (every
registered one, from what it declares) and the learning rate, and predicts each configuration's
throughput, memory per device, steps to the goal (S = S_min(1 + B_noise/B), McCandlish et al.
2018) and time to the goal with a band from every input's uncertainty. It recommends the
fastest (and the cheapest in device-hours when another), says what limits it, and writes
advice.json, advice.csv and advice.png. With --verify K it runs the recommendation and the K
next here and sets the measured time beside the predicted one. Formulas: docs/advise.md.
"""

EXAMPLES = """\
examples:
  parascale advise --model smallcnn --dataset digits --target-accuracy 0.95 --epochs 10 \\
      --workers 2 --verify 2
  parascale advise --task examples/regression.py:task --optimizer adamw --lr 0.01 \\
      --target-metric mae --target-value 0.2 --epochs 20
  parascale advise --model resnet50 --dataset imagefolder --data-dir data --batch-size 256 \\
      --lr 0.1 --target-accuracy 0.75 --epochs 90 --nodes 8 --gpus-per-node 8 \\
      --interconnect ib100 --device-memory 80GiB --gpu H100 --noise-scale 8000 \\
      --noise-scale-se 1500 --steps-to-target 450000 --params 25.6M --flops-per-sample 12.3G \\
      --train-samples 1281167
"""


def _count(option: str, what: str = "a positive number with an optional K, M or G"):
    def parse(text: str) -> float:
        from parascale.errors import UsageError
        from parascale.predict.gradient import parse_count

        try:
            return parse_count(text, option)
        except UsageError:
            raise argparse.ArgumentTypeError(f"cannot read {text!r}; give {what}, e.g. "
                                             "25.6M") from None
    return parse


def _memory(text: str) -> float:
    """'80' (GiB, as predict takes it), '80GiB', '512MiB' -> bytes."""
    from parascale.runtime.memory_cap import SIZE_WORDS, read_size

    if text.strip().replace(".", "", 1).isdigit() and text.strip().isascii():
        return float(text) * 2 ** 30
    size = read_size(text)
    if size is None:
        raise argparse.ArgumentTypeError(f"expected GiB or {SIZE_WORDS}, got {text!r}")
    return float(size)


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _batches(text: str) -> tuple[int, ...]:
    return int_list(text, "per-device batches such as 16,32,64")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from parascale.advise.options import BUDGETS, DECIDED, LR_RULES

    parser = subparsers.add_parser(
        "advise", help="what to run (devices, batch, learning rate, strategy) and how long "
        "to the goal", description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_argument_group("resources: CPU workers here, or a cluster described")
    where.add_argument("--workers", dest="max_workers", type=ascii_int, metavar="N",
                       help="up to N CPU workers on this machine (default: one per core)")
    where.add_argument("--nodes", type=ascii_int, metavar="M", help="a cluster of M nodes")
    where.add_argument("--gpus-per-node", type=ascii_int, metavar="G",
                       help="devices per node of the cluster")
    where.add_argument("--interconnect", metavar="PRESET",
                       help="the link between nodes: nvlink, pcie, ib100, 25gbe, loopback")
    where.add_argument("--intra-node", metavar="PRESET",
                       help="the link inside a node (default nvlink)")
    where.add_argument("--comm", metavar="DIR", type=path_option("--comm"),
                       help="a 'parascale comm' record: the link measured (inside a node on "
                            "a cluster)")
    where.add_argument("--device-memory", dest="memory", type=_memory, metavar="SIZE",
                       help="what one device holds: 80 (GiB) or 80GiB; here, each worker's "
                            "budget (default: half the memory free, over the workers)")
    where.add_argument("--gpu", metavar="NAME",
                       help="the cluster's GPU (H100, A100, ...): its datasheet peak")
    where.add_argument("--peak-tflops", type=ascii_float, metavar="T",
                       help="the cluster's device peak in TFLOP/s, instead of --gpu")
    where.add_argument("--mfu", type=ascii_float, metavar="F",
                       help="the share of that peak the job reaches (default 0.4, assumed)")
    goal = parser.add_argument_group("the goal, when not a target (--target-metric M "
                                     "--target-value V, or --target-accuracy, below)")
    for unit in BUDGETS:
        goal.add_argument(f"--budget-{unit}", dest=f"budget_{unit}", metavar="N",
                          type=_count(f"--budget-{unit}"),
                          help=f"train for this many {unit} at the job's batch (the samples "
                               "at other batches follow the noise scale)")
    search = parser.add_argument_group("the space")
    search.add_argument("--strategies", type=_names, metavar="S,...",
                        help=f"strategies to search (default every one: "
                             f"{', '.join(sync.names())})")
    search.add_argument("--batch-sizes", type=_batches, metavar="B,...",
                        help="per-device batches (default powers of two from a quarter to 8x "
                             "the job's)")
    search.add_argument("--max-accumulate", type=ascii_int, default=8, metavar="A",
                        help="most micro-batches accumulated where memory caps the batch "
                             "(default 8)")
    search.add_argument("--precisions", type=_names, metavar="P,...",
                        help="on a cluster: precisions to search (default the job's)")
    search.add_argument("--lr-rule", choices=LR_RULES, default="bounded",
                        help="the rate at another global batch: bounded (default: linear for "
                             "SGD, square root for AdamW, levelling off beyond the noise "
                             "scale, McCandlish et al. 2018), linear, sqrt or none")
    search.add_argument("--exact-only", action="store_true",
                        help="only strategy variants that step on the global batch's mean "
                             "gradient, whose steps the noise-scale model covers (no "
                             "compression, no periods of local steps)")
    given = parser.add_argument_group("figures given by hand (each saves a measurement)")
    given.add_argument("--noise-scale", dest="given_noise", type=ascii_float, metavar="B",
                       help="the gradient noise scale in samples")
    given.add_argument("--noise-scale-se", type=ascii_float, metavar="SE",
                       help="its standard error")
    given.add_argument("--steps-to-target", type=_count("--steps-to-target"), metavar="S",
                       help="optimizer steps the job takes to its target at its own batch")
    given.add_argument("--params", type=_count("--params"), metavar="N",
                       help="parameters, e.g. 25.6M")
    given.add_argument("--flops-per-sample", type=_count("--flops-per-sample"), metavar="F",
                       help="forward + backward FLOPs per sample, e.g. 12.3G")
    given.add_argument("--activations-per-sample", type=_count("--activations-per-sample"),
                       metavar="BYTES", help="activation bytes per sample, e.g. 20M")
    given.add_argument("--train-samples", type=ascii_int, metavar="N",
                       help="samples in the training set")
    given.add_argument("--records", nargs="+", metavar="PATH", default=[],
                       help="run records of the job on the cluster's device (a study, a train "
                            "--out or a record.json): their step times replace the FLOPs")
    here = parser.add_argument_group("measuring here")
    here.add_argument("--probe-steps", type=ascii_int, default=30, metavar="K",
                      help="steps of each step-time probe (default 30)")
    here.add_argument("--pilot-epochs", type=ascii_int, default=2, metavar="E",
                      help="with a budget: epochs of the run that measures the noise scale "
                           "(default 2)")
    here.add_argument("--remeasure", action="store_true",
                      help="measure again (default: keep OUT/measure's runs)")
    add_quiet_option(here)
    parser.add_argument("--verify", type=ascii_int, default=0, metavar="K",
                        help="run the recommendation and the K next here and set the measured "
                             "time to the goal beside the predicted")
    parser.add_argument("--out", dest="advice_out", metavar="DIR", type=path_option("--out"),
                        help="where advice.json, .csv, .png and the measurements go (default "
                             "advice/<model>-<dataset>)")
    # --peak-tflops is the cluster device's here, not a setting of the job
    add_train_options(parser, exclude=DECIDED | set(sync.options()) | {"peak_tflops"})
    parser.set_defaults(func=run)
    return parser


def options_from(args: argparse.Namespace):
    from parascale.advise.options import BUDGETS, Options
    from parascale.errors import UsageError

    budgets = [(u, getattr(args, f"budget_{u}")) for u in BUDGETS
               if getattr(args, f"budget_{u}") is not None]
    if len(budgets) > 1:
        raise UsageError("give one budget: --budget-samples, --budget-tokens or "
                         "--budget-epochs")
    unit, budget = budgets[0] if budgets else (None, None)
    return Options(
        job=config_from_args(args), workers=args.max_workers, nodes=args.nodes,
        gpus_per_node=args.gpus_per_node, interconnect=args.interconnect,
        intra_node=args.intra_node, comm=args.comm, device_memory=args.memory, gpu=args.gpu,
        peak_tflops=args.peak_tflops, mfu=args.mfu, budget=budget, budget_unit=unit,
        strategies=args.strategies, batch_sizes=args.batch_sizes,
        max_accumulate=args.max_accumulate, precisions=args.precisions,
        lr_rule=args.lr_rule, exact_only=args.exact_only, records=tuple(args.records), noise_scale=args.given_noise,
        noise_scale_se=args.noise_scale_se, steps_to_target=args.steps_to_target,
        params=args.params, flops_per_sample=args.flops_per_sample,
        activations_per_sample=args.activations_per_sample,
        train_samples=args.train_samples, probe_steps=args.probe_steps,
        pilot_epochs=args.pilot_epochs, remeasure=args.remeasure,
        quiet_machine=args.quiet_machine, verify=args.verify, out=args.advice_out)


def run(args: argparse.Namespace) -> int:
    opts = options_from(args)
    from parascale.advise import output, verify
    from parascale.advise.advice import advise

    advice, out = advise(opts, lambda line: print(line, flush=True))
    here = not opts.cluster
    print()
    print(output.text(advice, opts.job, here), flush=True)
    if opts.verify and advice.recommended is not None:
        target = opts.budget is None
        print()
        advice.checks = verify.run(advice, opts.job, verify.chosen_for(advice, opts.verify),
                                   out / "verify", target,
                                   lambda line: print(line, flush=True),
                                   quiet_max_s=opts.quiet_machine)
        print()
        print(verify.table(advice.checks))
    paths = output.write(advice, opts.job, out, here)
    print("wrote: " + ", ".join(str(p) for p in paths))
    if opts.verify and advice.recommended is None:
        print("--verify: nothing was recommended, so nothing was verified", file=sys.stderr)
    return 0
