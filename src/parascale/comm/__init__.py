"""``parascale comm``: how fast the current world's interconnect moves collectives.

A microbenchmark in the manner of nccl-tests: allreduce, broadcast, reduce and all-gather of
float32 messages from bytes to hundreds of MB, on the same workers (gloo on CPU, NCCL on GPUs)
that training would use. For each operation and size: warm-up iterations, then timed ones;
the time of a size is the slowest rank's median iteration. Bandwidths follow nccl-tests'
definitions (nccl-tests' doc/PERFORMANCE.md): algorithm bandwidth ``algbw = S / t`` and bus bandwidth
``busbw = algbw * factor``, with factor 2(n-1)/n for allreduce, (n-1)/n for all-gather and 1
for broadcast and reduce, so that figures compare across worker counts. S is the message size
(all-gather: the gathered output, each rank contributing S/n).

The record (``DIR/comm.json``, schema ``parascale.comm/1``) is described in
docs/strategies.md.
"""
from parascale.comm.config import (DEFAULT_SIZES, ELEMENT_BYTES, OPS, RECORD_NAME, SCHEMA,
                                   CommConfig, bus_factor, format_size, iterations_for,
                                   parse_size, validate)
from parascale.comm.measure import format_table, run

__all__ = ["DEFAULT_SIZES", "ELEMENT_BYTES", "OPS", "RECORD_NAME", "SCHEMA", "CommConfig",
           "bus_factor", "format_size", "format_table", "iterations_for", "parse_size", "run",
           "validate"]
