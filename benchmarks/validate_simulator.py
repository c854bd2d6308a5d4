"""Simulator validation: predicted sync time against RayEngine's measured one, on this machine.

    python benchmarks/validate_simulator.py [--model resnet50] [--iters 5] [--out benchmarks/results]

For each configuration (strategy x codec x workers) the same plan is (1) run on RayEngine over an embedded
local Ray, taking the median sync span from the engine's timeline (first op after the gradient load to the
last op), and (2) simulated on a one-node ClusterModel with this machine's core count and the profile
(``--profile``, default: the one shipped with casync).  Writes a Markdown table and JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import casync
from casync._table import format_table, markdown_table
from casync.compare import random_grads
from casync.costmodel import ClusterModel, Profile
from casync.inputs import flatten_worker_grads
from casync.runtime.ray_engine import RayEngine, connect_ray
from casync.simulator import simulate

CONFIGS = [
    ("ring", "none", 2), ("ring", "onebit", 4), ("ring", "topk:ratio=0.01", 3),
    ("ps", "none", 4), ("ps", "onebit", 2), ("ps", "fp16", 3),
    ("allgather", "onebit", 4), ("allgather", "topk:ratio=0.01", 2),
]


def measured_span(engine: RayEngine, flats, iters: int) -> float:
    spans = []
    engine.run_flat(flats)  # warm-up
    for _ in range(iters):
        engine.clear_timeline()
        engine.run_flat(flats)
        rows = engine.timeline()
        first = min(r["start"] for r in rows if r["op"] != "load")
        spans.append(max(r["end"] for r in rows) - first)
    return statistics.median(spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--bucket-bytes", type=int, default=None)
    parser.add_argument("--profile", default=None, help="profile JSON (default: the packaged one)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    profile = Profile.load(args.profile) if args.profile else Profile.default()
    cores = os.cpu_count() or 1
    connect_ray(None, num_cpus=max(4, cores))
    rows, raw = [], []
    for strategy, codec, workers in CONFIGS:
        plan = casync.build_plan(args.model, workers=workers, strategy=strategy, codec=codec,
                                 bucket_bytes=args.bucket_bytes)
        flats, _ = flatten_worker_grads(plan, random_grads(plan))
        with RayEngine(plan, timeout_s=300) as engine:
            measured = measured_span(engine, flats, args.iters)
        predicted = simulate(plan, ClusterModel(nodes=1, workers_per_node=workers, cores_per_node=cores),
                             profile).sync_time()
        err = (predicted - measured) / measured
        rows.append([strategy, codec, workers, round(measured * 1e3, 1), round(predicted * 1e3, 1),
                     f"{100 * err:+.0f}%"])
        raw.append(dict(strategy=strategy, codec=codec, workers=workers, measured_s=measured,
                        predicted_s=predicted, rel_error=err))
        print(format_table(["strategy", "codec", "N", "measured ms", "predicted ms", "error"], rows[-1:]))
    headers = ["strategy", "codec", "N", "measured ms", "predicted ms", "error"]
    within = sum(abs(r["rel_error"]) <= 0.2 for r in raw)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = (f"# Simulator validation ({args.model})\n\nGenerated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by\n\n"
            f"```\npython benchmarks/validate_simulator.py --model {args.model} --iters {args.iters}\n```\n\n"
            f"Machine: {cores} cores, shared and noisy. Measured: RayEngine on an embedded local Ray, median sync "
            f"span of {args.iters} iterations. Predicted: `casync.simulate` on ClusterModel(nodes=1, "
            f"cores_per_node={cores}) with the packaged profile.\n\n"
            + markdown_table(headers, rows) + f"\n\n{within} of {len(raw)} configurations within 20%.\n")
    (out / "simulator_validation.md").write_text(text)
    (out / "simulator_validation.json").write_text(json.dumps(raw, indent=1) + "\n")
    print(format_table(headers, rows))
    print(f"{within}/{len(raw)} within 20%; wrote {out / 'simulator_validation.md'}")


if __name__ == "__main__":
    main()
