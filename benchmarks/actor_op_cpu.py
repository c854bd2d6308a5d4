"""Each actor's op CPU by kind, beside the sync's step span: RayEngine on this machine, for before/after checks.

    python benchmarks/actor_op_cpu.py [--configs ring/onebit,ps-twoway/randomk:ratio=0.01] [--model resnet50]
                                      [--workers 4] [--compute-threads 1] [--iters 9] [--out DIR]

A configuration is ``strategy/codec`` as ``casync bench`` names it, optionally ``@P`` for P partitions per bucket
(``ring/onebit@8``; default: the plan's).  Each configuration's plan runs as ``casync bench`` runs it (gradients made as ObjectRefs on the actors' node,
untimed warm-up syncs, the direct data plane).  Reported: the median step span
(:func:`casync.bench.measure.step_span`) and, from the median sync's timeline, each actor's op CPU (the thread
CPU of its encodes, decodes, merges and sends) by kind, averaged over actors.  An engine change that saves a pass
over memory shows in the op CPU even where the span, on shared cores, moves within the noise.

For an A/B, run it alternately from two checkouts (``PYTHONPATH=<checkout> python <checkout>/benchmarks/...``)
from a directory outside both: Ray's workers add the driver's working directory to their import path.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from casync.table import markdown_table  # noqa: E402
from result_files import write_results  # noqa: E402


def op_cpu_by_kind(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds of op CPU per actor by op kind (the mean over the actors in ``rows``), and ``"total"``."""
    per: dict[tuple[str, str], float] = defaultdict(float)
    actors = {r["actor"] for r in rows if r.get("cpu") is not None and r["op"] != "load"}
    for r in rows:
        if r.get("cpu") is not None and r["op"] != "load":
            per[r["actor"], r["op"]] += r["cpu"]
    kinds: dict[str, float] = defaultdict(float)
    for (_, op), cpu in per.items():
        kinds[op] += cpu / len(actors)
    kinds["total"] = sum(kinds.values())
    return dict(sorted(kinds.items()))


def ops_in_flight(rows: list[dict[str, Any]]) -> float:
    """How many ops an actor ran at once on average over the sync (its ops' wall time over the span, the mean over
    actors): how much of ``compute_threads`` the schedule kept busy."""
    ops = [r for r in rows if r["op"] in ("encode", "decode", "merge", "send")]
    if not ops:
        return 0.0
    span = max(r["end"] for r in ops) - min(r["start"] for r in ops)
    actors = {r["actor"] for r in ops}
    return sum(r["end"] - r["start"] for r in ops) / span / len(actors) if span > 0 else 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="ring/onebit,ps-twoway/randomk:ratio=0.01")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--compute-threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=9)
    parser.add_argument("--out", default=None, help="write actor_op_cpu.md/.json there")
    args = parser.parse_args(argv)

    import ray

    from casync.bench.grid import plan_arguments
    from casync.bench.measure import measure_plan
    from casync.bench.predict import make_plan
    from casync.build import build_plan
    from casync.runtime.gradients import GradientStore
    from casync.sim.costmodel import ClusterModel

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=1_500_000_000,
             log_to_driver=False)
    store, rows = GradientStore(args.model), []
    for config in args.configs.split(","):
        cell, _, partitions = config.partition("@")
        strategy, codec = cell.split("/", 1)
        if partitions:
            plan = build_plan(args.model, workers=args.workers, partitions=int(partitions),
                              **plan_arguments(strategy, codec, (codec,)))
        else:
            plan = make_plan(args.model, args.workers, strategy, codec, (codec,),
                             ClusterModel(nodes=1, workers_per_node=args.workers))
        run = measure_plan(plan, store, None, address=None, iters=args.iters, transport="direct",
                           compute_threads=args.compute_threads)
        cpu = op_cpu_by_kind(run.timeline)
        row = dict(config=config, span_ms=round(statistics.median(run.sync_s) * 1e3, 1),
                   spans_ms=[round(s * 1e3, 1) for s in run.sync_s], consistent=run.consistent,
                   ops_in_flight=round(ops_in_flight(run.timeline), 2),
                   **{f"{k}_cpu_ms": round(v * 1e3, 1) for k, v in cpu.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
    ray.shutdown()
    if args.out:
        columns = ["config", "span_ms", "ops_in_flight"] + sorted({k for r in rows for k in r if k.endswith("_cpu_ms")})
        text = (f"# Op CPU per actor\n\n```\npython benchmarks/actor_op_cpu.py {' '.join(argv or sys.argv[1:])}\n```\n\n"
                + markdown_table(columns, [[r.get(c, "") for c in columns] for r in rows]) + "\n")
        write_results(args.out, "actor_op_cpu", text, dict(args=vars(args), rows=rows))


if __name__ == "__main__":
    main()
