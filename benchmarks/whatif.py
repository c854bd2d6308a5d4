"""What-if: simulated iteration time of uncompressed ring vs the best fixed choice vs the planner (``auto``).

    python benchmarks/whatif.py [--models resnet50,vgg16,bert-base,gpt2] [--workers 8,16,64]
                                [--gbps 1,10,25,100] [--backward-ms 0] [--out benchmarks/results/whatif]

For every model, cluster size (one worker per node, 50 us links) and NIC bandwidth:

* **ring/none** — uncompressed CaSync-Ring with default partitions, the baseline;
* **best fixed** — the fastest of every strategy (ring, co-located two-way ps, allgather) x codec (none,
  fp16, onebit, topk:ratio=0.01) applied to all buckets with default partitions;
* **auto** — ``build_plan(strategy="auto", codec="auto", partitions="auto", cluster=...)``.

All times come from :func:`casync.sim.simulator.simulate` on the full plan graph, except where that graph is
too large to simulate quickly (64 workers): fixed plans are then simulated as compact symmetric templates
where those stand for exactly the full plan (``compact_is_exact``; marked ``c``, the same iteration time as
the full plan's simulation) or else taken from the planner's fast estimator (marked ``~``); an ``auto`` plan
too large for the full simulator is reported by the estimator too (``~``).  Writes ``whatif.md`` and
``whatif.json``.
"""
from __future__ import annotations

import argparse
import platform
import time

import casync
from casync.plan.assemble import (DEFAULT_BUCKET_BYTES, BucketChoice, assemble_plan, compact_is_exact,
                                  effective_partitions, make_buckets, name_buckets)
from casync.plan.tensors import tensor_specs
from casync.planner import Estimator, Option, backward_ready_times, timeline_estimate
from casync.sim.costmodel import ClusterModel, Profile
from casync.sim.simulator import simulate
from casync.table import format_table, markdown_table
from casync.primitives.codecs import get_codec
from result_files import write_results

STRATEGIES = ("ring", "ps", "allgather")
CODECS = ("none", "fp16", "onebit", "topk:ratio=0.01")
FULL_SIM_MAX_OPS = 150_000  # beyond this a full plan is not simulated here (tens of seconds each)


def fixed_times(model, workers, clusters, profile, ready):
    """{(strategy, codec): {gbps: (seconds, mark)}} for every uniform fixed plan."""
    specs = tensor_specs(model)
    groups = name_buckets(specs, make_buckets(specs, DEFAULT_BUCKET_BYTES))
    numels = [sum(s.numel for s in g) for _, g in groups]
    out = {}
    for s in STRATEGIES:
        for c in CODECS:
            choices = [BucketChoice(strategy=s, codec=get_codec(c))] * len(groups)
            parts = [effective_partitions(ch, workers, n) for ch, n in zip(choices, numels)]
            ops = sum(Estimator(workers, clusters[0][1], profile).cost(n, Option(s, get_codec(c), k)).ops
                      for n, k in zip(numels, parts))
            row = {}
            if ops <= FULL_SIM_MAX_OPS:
                plan = assemble_plan(specs, workers, groups, choices)
                for gbps, cl in clusters:
                    row[gbps] = (simulate(plan, cl, profile, ready).iteration_time, "")
            elif compact_is_exact(workers, groups, choices) and all(cl.asymmetry(workers) is None for _, cl in clusters):
                plan = assemble_plan(specs, workers, groups, choices, compact=True)
                for gbps, cl in clusters:
                    row[gbps] = (simulate(plan, cl, profile, ready).iteration_time, "c")
            else:
                for gbps, cl in clusters:
                    est = Estimator(workers, cl, profile)
                    costs = [est.cost(n, Option(s, get_codec(c), k)) for n, k in zip(numels, parts)]
                    ready_b = [max((ready or {}).get(t.name, 0.0) for t in g) for _, g in groups]
                    row[gbps] = (timeline_estimate(costs, ready_b, workers)[0], "~")
            out[(s, c)] = row
    return out


def auto_time(model, workers, cl, profile, ready):
    start = time.perf_counter()
    plan = casync.build_plan(model, workers=workers, strategy="auto", codec="auto", partitions="auto",
                             cluster=cl, profile=profile, ready_times=ready)
    seconds = time.perf_counter() - start
    info = plan.options["planner"]
    if info["simulated_s"] is not None:
        t, mark = info["simulated_s"], ""
    elif plan.graph.number_of_nodes() <= FULL_SIM_MAX_OPS:
        t, mark = simulate(plan, cl, profile, ready).iteration_time, ""
    else:
        t, mark = info["estimated_s"], "~"
    mix = {}
    for b in plan.buckets:
        key = f"{b.strategy}/{b.codec.name}"
        mix[key] = mix.get(key, 0) + 1
    return t, mark, seconds, ", ".join(f"{k}x{v}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,vgg16,bert-base,gpt2")
    parser.add_argument("--workers", default="8,16,64")
    parser.add_argument("--gbps", default="1,10,25,100")
    parser.add_argument("--latency-us", type=float, default=50.0)
    parser.add_argument("--backward-ms", type=float, default=0.0,
                        help="overlap with a backward pass this long (0: gradients all ready at once)")
    parser.add_argument("--out", default="benchmarks/results/whatif")
    args = parser.parse_args()
    profile = Profile.default()
    models = args.models.split(",")
    workers_list = [int(w) for w in args.workers.split(",")]
    gbps_list = [float(g) for g in args.gbps.split(",")]
    rows, raw = [], []
    t0 = time.perf_counter()
    for model in models:
        ready = backward_ready_times(model, args.backward_ms / 1e3) if args.backward_ms else None
        for workers in workers_list:
            clusters = [(g, ClusterModel.for_workers(workers, bandwidth_gbps=g, latency_us=args.latency_us))
                        for g in gbps_list]
            fixed = fixed_times(model, workers, clusters, profile, ready)
            for gbps, cl in clusters:
                base, base_mark = fixed[("ring", "none")][gbps]
                (bs, bc), (best, best_mark) = min(((k, v[gbps]) for k, v in fixed.items()), key=lambda kv: kv[1][0])
                t_auto, auto_mark, seconds, mix = auto_time(model, workers, cl, profile, ready)
                rows.append([model, workers, f"{gbps:g}", f"{base * 1e3:,.1f}{base_mark}",
                             f"{best * 1e3:,.1f}{best_mark}", f"{bs}/{bc}", f"{t_auto * 1e3:,.1f}{auto_mark}",
                             f"{base / t_auto:.2f}x", f"{best / t_auto:.2f}x", f"{seconds:.2f}", mix])
                raw.append(dict(model=model, workers=workers, gbps=gbps, ring_none_s=base, ring_none_mark=base_mark,
                                best_fixed_s=best, best_fixed=f"{bs}/{bc}", best_fixed_mark=best_mark,
                                auto_s=t_auto, auto_mark=auto_mark, planner_s=seconds, auto_mix=mix,
                                fixed={f"{s}/{c}": v[gbps][0] for (s, c), v in fixed.items()}))
                print(format_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
    elapsed = time.perf_counter() - t0
    cmd = (f"python benchmarks/whatif.py --models {args.models} --workers {args.workers} --gbps {args.gbps}"
           + (f" --backward-ms {args.backward_ms:g}" if args.backward_ms else ""))
    text = (
        "# What-if: uncompressed ring vs best fixed choice vs the planner\n\n"
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by\n\n```\n{cmd}\n```\n\n"
        f"({elapsed:.0f} s on {platform.node() or 'this machine'}, Python {platform.python_version()}.)\n\n"
        "Simulated iteration time (`casync.simulate`, packaged profile) of one gradient synchronization, "
        f"{'all gradients ready at t=0' if not args.backward_ms else f'overlapped with a {args.backward_ms:g} ms backward pass'}"
        f"; one worker per node, {args.latency_us:g} us links, default bucketing "
        f"({DEFAULT_BUCKET_BYTES >> 20} MiB). *ring/none*: uncompressed CaSync-Ring, default partitions. "
        "*best fixed*: the fastest single (strategy, codec) for all buckets over ring / ps (co-located, "
        "two-way) / allgather x none / fp16 / onebit / topk:ratio=0.01, default partitions. *auto*: "
        "`build_plan(strategy=\"auto\", codec=\"auto\", partitions=\"auto\", cluster=...)`; *plan s*: the "
        "planner's wall time on this 2-core machine; *auto mix*: buckets per strategy/codec.\n\n"
        "Marks: `c` = simulated as a compact symmetric template (`assemble_plan(compact=True)`), used for "
        "fixed plans too large to simulate in full (64 workers) where the template stands for exactly the full "
        "plan (`compact_is_exact`: the same iteration time); `~` = the planner's fast estimator (no "
        "simulation).\n\n"
        + markdown_table(HEADERS, rows) + "\n")
    md = write_results(args.out, "whatif", text, raw)
    print(f"wrote {md} ({elapsed:.0f} s)")


HEADERS = ["model", "N", "Gbps", "ring/none ms", "best fixed ms", "best fixed", "auto ms", "vs ring/none",
           "vs best fixed", "plan s", "auto mix"]

if __name__ == "__main__":
    main()
