"""``parascale comm``: collective microbenchmark of the current world (allreduce, broadcast...)."""
from __future__ import annotations

import argparse
import datetime

from parascale.checks import path_option
from parascale.comm import DEFAULT_SIZES, OPS, CommConfig, format_size, parse_size
from parascale.digits import ascii_float, ascii_int, int_list

DESCRIPTION = """\
Time allreduce, broadcast, reduce and all-gather of float32 messages on N workers (gloo on CPU
cores, NCCL on GPUs, or the world of torchrun/srun), from bytes to hundreds of MB. For each
operation and size: warm-up iterations, then timed iterations; the time is the slowest rank's
median. Bandwidths follow nccl-tests: algbw = size / time, busbw = algbw x 2(n-1)/n for
allreduce, x (n-1)/n for all-gather, x 1 for broadcast and reduce.

Prints a table and writes DIR/comm.json (schema parascale.comm/1, see docs/strategies.md).
"""

EXAMPLES = """\
examples:
  parascale comm --workers 2
  parascale comm --workers 4 --sizes 1K,1M,64M --ops allreduce --out runs/comm-4
  torchrun --nproc-per-node 4 -m parascale comm --gpus 0,1,2,3
"""


def _int_list(text: str) -> tuple[int, ...]:
    return int_list(text, "integers")


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "comm", help="measure collective time and bandwidth on N workers (nccl-tests style)",
        description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = CommConfig()
    parser.add_argument("--workers", type=ascii_int, metavar="N",
                        help="CPU worker processes (default: one per core)")
    parser.add_argument("--gpus", type=_int_list, metavar="0,1,...",
                        help="CUDA device indices, one worker each")
    parser.add_argument("--sizes", type=str, metavar="S,...",
                        help="message sizes, bytes with K/M/G suffixes (powers of 1024); default "
                             f"{format_size(DEFAULT_SIZES[0])} to {format_size(DEFAULT_SIZES[-1])}"
                             " in x4 steps")
    parser.add_argument("--ops", type=_words, metavar="OP,...", default=defaults.ops,
                        help=f"collectives to time (default: {','.join(OPS)})")
    parser.add_argument("--warmup", type=ascii_int, default=defaults.warmup,
                        help=f"untimed iterations first (default: {defaults.warmup})")
    parser.add_argument("--iters", type=ascii_int, default=defaults.iters,
                        help=f"most timed iterations per point (default: {defaults.iters})")
    parser.add_argument("--min-iters", type=ascii_int, default=defaults.min_iters,
                        help="fewest timed iterations per point; between the two, as many "
                             f"as fit {defaults.seconds_per_point:g} s "
                             f"(default: {defaults.min_iters})")
    parser.add_argument("--timeout", type=ascii_float, default=defaults.timeout,
                        help=f"seconds before a stuck collective fails the job "
                             f"(default: {defaults.timeout:g})")
    parser.add_argument("--port", type=ascii_int, help="port of the local rendezvous store")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="run more than 4 workers per core (otherwise refused)")
    parser.add_argument("--out", metavar="DIR", type=path_option("--out"), help="folder for comm.json "
                        "(default: runs/comm-<date>-<time>)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from parascale import comm
    from parascale.errors import UsageError

    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be a positive int, got {args.workers}")
    sizes = tuple(parse_size(s) for s in args.sizes.split(",") if s.strip()) \
        if args.sizes is not None else DEFAULT_SIZES
    out = args.out or f"runs/comm-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    cfg = CommConfig(workers=args.workers, gpus=args.gpus, sizes=sizes, ops=args.ops,
                     warmup=args.warmup, iters=args.iters, min_iters=args.min_iters,
                     timeout=args.timeout, port=args.port,
                     oversubscribe=args.oversubscribe, out=out)
    record = comm.run(cfg)
    if not record:  # a non-zero rank under torchrun/srun: rank 0 reports
        return 0
    print(comm.format_table(record))
    print(f"record: {out}/{comm.RECORD_NAME}")
    return 0
