"""``parascale predict``: predicted scaling from run records and an interconnect (no workers)."""
from __future__ import annotations

import argparse

from parascale import sync
from parascale.checks import path_option
from parascale.cli.options import key_value
from parascale.digits import ascii_float, ascii_int, int_list

DESCRIPTION = """\
Predict how a data-parallel run scales to N = 1 ... thousands of devices, from run records you
already have (a study folder, a train --out folder or a record.json) and an interconnect: its
latency and bandwidth fitted to a 'parascale comm' record (--comm), or a named preset
(--interconnect nvlink|pcie|ib100|25gbe|loopback, each with its source).

Per N, under weak (per-device batch fixed) and strong (global batch fixed) scaling: the step
time split into compute, waiting for the slowest device and exposed communication, with
throughput, speedup and efficiency. The inputs are printed first, each marked measured, fitted,
counted, given or assumed; where the study measured a worker count, its efficiency is shown
beside the prediction. Where the study ran contention baselines (bench --baseline), their
measured compute is the compute at their N (N processes sharing a machine slow each other).
Formulas and assumptions: docs/predict.md. Starts no process.
"""

EXAMPLES = """\
examples:
  parascale predict studies/s1 --comm runs/comm-2
  parascale predict runs/one/record.json --interconnect ib100 --workers 1,8,64,512
  parascale predict studies/s1 --interconnect ib100 --gpus-per-node 8 --intra-node nvlink
  parascale predict studies/s1 --comm runs/comm-2 --sync parameter-server --ps-servers 4
  parascale predict studies/s1 --interconnect 25gbe --noise-scale 2000 --out pred/
  parascale predict --params 7e9 --device-memory 80
  parascale predict runs/fsdp --device-memory 16 --workers 1,2,4,8
"""


def _workers(text: str) -> tuple[int, ...]:
    return int_list(text, "worker counts such as 1,2,4,8")


def _count(option: str):
    def parse(text: str) -> float:
        from parascale.errors import UsageError
        from parascale.predict.gradient import parse_count

        try:
            return parse_count(text, option)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{option}: ")) from None
    return parse


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "predict", help="predict scaling to N devices from run records and an interconnect",
        description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="*", metavar="STUDY_OR_RECORD",
                        help="study folder, train --out folder, or record.json")
    link = parser.add_argument_group("interconnect")
    link.add_argument("--comm", metavar="RECORD",
                      help="a 'parascale comm' record (comm.json or its folder): α, β fitted")
    link.add_argument("--interconnect", metavar="PRESET",
                      help="a named link: nvlink, pcie, ib100, 25gbe, loopback (assumed figures, "
                           "source printed)")
    link.add_argument("--gpus-per-node", type=ascii_int, metavar="G",
                      help="hierarchical: rings inside nodes of G devices and across nodes; "
                           "--interconnect is then the link between nodes")
    link.add_argument("--intra-node", metavar="PRESET",
                      help="with --gpus-per-node: the link inside a node (default nvlink; "
                           "or --comm measured on one node)")
    what = parser.add_argument_group("what to predict")
    what.add_argument("--sync", metavar="S",
                      help=f"{', '.join(sync.with_pattern())}, or tree (a ring's overlap "
                           "with a tree's exchange); its options: the records', else their "
                           "defaults (default: the records' own)")
    what.add_argument("--ps-servers", type=ascii_int, default=1, metavar="K",
                      help="parameter servers (default: the records', else 1)")
    what.add_argument("--period", type=ascii_int, default=1, metavar="H",
                      help="steps between a periodic strategy's exchanges (default: the "
                           "records', else 1)")
    what.add_argument("--sync-option", type=key_value, action="append", metavar="KEY=VALUE",
                      help="another option of the strategy, as train takes it (default: the "
                           "records', else the option's own)")
    what.add_argument("--workers", type=_workers, metavar="1,2,4,...",
                      help="worker counts (default: powers of two 1 to 4096)")
    what.add_argument("--scaling", choices=("weak", "strong"),
                      help="one mode only (default: the study's modes, else both)")
    what.add_argument("--batch-size", type=ascii_int, metavar="B",
                      help="per-device batch for weak scaling (default: the records')")
    what.add_argument("--global-batch", type=ascii_int, metavar="B",
                      help="global batch for strong scaling (default: the study's strong "
                           "runs', else the global batch the records at the smallest N "
                           "trained with)")
    what.add_argument("--model", metavar="NAME",
                      help="the model to predict when the records hold several")
    given = parser.add_argument_group("figures given by hand (reported as given or assumed)")
    given.add_argument("--params", type=_count("--params"), metavar="N",
                       help="parameter count, e.g. 25.6M (gradients of 4 bytes each)")
    given.add_argument("--gradient-bytes", type=_count("--gradient-bytes"), metavar="S",
                       help="bytes a step exchanges, e.g. 102.4M")
    given.add_argument("--overlap", type=ascii_float, metavar="F",
                       help="share of compute that communication can hide behind (0-1; "
                            "default: measured, else 2/3)")
    given.add_argument("--noise-scale", type=ascii_float, metavar="B",
                       help="gradient noise scale in samples (assumed): adds steps and "
                            "time-to-accuracy speedup (McCandlish et al. 2018)")
    memory = parser.add_argument_group("memory per device (docs/predict.md)")
    memory.add_argument("--device-memory", type=ascii_float, metavar="GIB",
                        help="how many devices of GIB GiB the model needs under each strategy "
                             "(replicated, ZeRO stages 1-3), from --params N or a record's "
                             "measured memory split, and GiB per device for --workers; "
                             "prints, writes no file")
    parser.add_argument("--out", metavar="DIR", type=path_option("--out"),
                        help="write prediction.json, prediction.csv and prediction.png here")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from parascale import predict
    from parascale.errors import UsageError

    if args.device_memory is not None:
        from parascale.predict.memory import answer

        if args.out:
            raise UsageError("--out: predict --device-memory prints its answer and writes no "
                             "file; leave out --out, or predict scaling without "
                             "--device-memory")

        print(answer(args.sources, args.params, args.device_memory,
                     list(args.workers or (1, 2, 4, 8, 16, 64, 256, 1024)), args.model))
        return 0
    if not args.sources:
        raise UsageError("predict needs a study folder, train --out folder or record.json "
                         "(or --params N --device-memory GIB for memory alone)")
    from parascale.files import check_writable_folder
    from parascale.predict.table import format_prediction

    opts = predict.Options(
        sources=args.sources, comm=args.comm, interconnect=args.interconnect, sync=args.sync,
        ps_servers=args.ps_servers, period=args.period,
        sync_options=dict(args.sync_option or []),
        workers=args.workers if args.workers is not None else predict.DEFAULT_WORKERS,
        scaling=args.scaling, batch_size=args.batch_size, global_batch=args.global_batch,
        gpus_per_node=args.gpus_per_node, intra_node=args.intra_node, params=args.params,
        gradient_bytes=args.gradient_bytes, overlap=args.overlap, noise_scale=args.noise_scale,
        model=args.model)
    if args.out:
        check_writable_folder(args.out)
    prediction = predict.predict(opts)
    print(format_prediction(prediction))
    if args.out:
        paths = predict.write(prediction, args.out)
        print("wrote: " + ", ".join(str(p) for p in paths))
    return 0
