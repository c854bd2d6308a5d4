"""Compact templates against the full plan: simulated iteration time, ops and simulation time.

    python benchmarks/compact_templates.py [--model resnet50] [--workers 16,64] [--gbps 100]
                                           [--out benchmarks/results/compact_templates]

For every strategy (PS one- and two-way) x codec (none, onebit) the model's default plan (25 MiB buckets,
default partitions: whole rotations here) is simulated in full and as its compact template
(``assemble_plan(compact=True)``) on one worker per node.  A control row simulates one bucket whose size
does and does not divide by the worker count: its partitions differ by one element or not at all, which
must not change the simulated time (it did by 2.5x before partitions were charged alike).  Writes
``compact_templates.md`` and ``compact_templates.json``.
"""
from __future__ import annotations

import argparse
import platform
import time

from casync.plan.assemble import BucketChoice, assemble_plan, compact_is_exact, make_buckets, name_buckets
from casync.plan.specs import TensorSpec
from casync.plan.tensors import tensor_specs
from casync.sim.costmodel import ClusterModel
from casync.sim.simulator import simulate
from casync.table import format_table, markdown_table
from casync.primitives.codecs import get_codec
from result_files import write_results

VARIANTS = {"ring": ("ring", True), "allgather": ("allgather", True), "ps-twoway": ("ps", True),
            "ps-oneway": ("ps", False)}
CODECS = ("none", "onebit")
HEADERS = ["model", "N", "strategy", "codec", "full ms", "compact ms", "compact / full", "full ops", "compact ops",
           "full sim s", "compact sim s"]


def timed(plan, cluster):
    start = time.perf_counter()
    t = simulate(plan, cluster).iteration_time
    return t, time.perf_counter() - start


def row(model, specs, workers, label, strategy, two_way, codec, cluster, bucket_bytes=25 << 20):
    groups = name_buckets(specs, make_buckets(specs, bucket_bytes))
    choices = [BucketChoice(strategy, get_codec(codec), two_way=two_way)] * len(groups)
    if not compact_is_exact(workers, groups, choices):
        return None
    full = assemble_plan(specs, workers, groups, choices)
    compact = assemble_plan(specs, workers, groups, choices, compact=True)
    (tf, sf), (tc, sc) = timed(full, cluster), timed(compact, cluster)
    return [model, workers, label, codec, f"{tf * 1e3:.2f}", f"{tc * 1e3:.2f}", f"{tc / tf:.4f}",
            f"{full.graph.number_of_nodes():,}", f"{compact.graph.number_of_nodes():,}", f"{sf:.2f}", f"{sc:.3f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", default="16,64")
    parser.add_argument("--gbps", type=float, default=100.0)
    parser.add_argument("--out", default="benchmarks/results/compact_templates")
    args = parser.parse_args()
    specs = tensor_specs(args.model)
    rows = []
    started = time.perf_counter()
    for workers in map(int, args.workers.split(",")):
        cluster = ClusterModel.for_workers(workers, bandwidth_gbps=args.gbps)
        for label, (strategy, two_way) in VARIANTS.items():
            for codec in CODECS:
                r = row(args.model, specs, workers, label, strategy, two_way, codec, cluster)
                if r is not None:
                    rows.append(r)
                    print(format_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
        for numel in (6_515_688, 6_515_688 - 6_515_688 % workers):  # one bucket: uneven, then even partitions
            r = row(f"one bucket of {numel:,}", [TensorSpec("w", (numel,))], workers, "ps-twoway", "ps", True, "none",
                    cluster)
            rows.append(r)
            print(format_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
    elapsed = time.perf_counter() - started
    text = ("# Compact templates against the full plan\n\n"
            f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by\n\n```\npython "
            f"benchmarks/compact_templates.py --model {args.model} --workers {args.workers} --gbps {args.gbps:g}\n```\n\n"
            f"({elapsed:.0f} s, Python {platform.python_version()}.)\n\n"
            f"Simulated iteration time of {args.model}'s default plan (25 MiB buckets, default partitions), all "
            f"gradients ready at t=0, one worker per node at {args.gbps:g} Gbit/s and 50 us, packaged profile: the "
            "full plan and its compact template (one representative worker). The last two rows of each worker "
            "count: one bucket whose size does not, then does, divide by the worker count.\n\n"
            + markdown_table(HEADERS, rows) + "\n")
    md = write_results(args.out, "compact_templates", text, [dict(zip(HEADERS, r)) for r in rows])
    print(f"wrote {md} ({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
