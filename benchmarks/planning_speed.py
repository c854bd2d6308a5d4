"""How long ``build_plan(strategy="auto", codec="auto", partitions="auto")`` takes to choose a plan.

Each planning call runs in a fresh Python process (nothing cached from an earlier call, imports excluded
from the time), ``--repeats`` times per (model, workers, bandwidth); the table gives the median and the
slowest, where the time went (the planner's own ``seconds``), and what it chose.

    python benchmarks/planning_speed.py                      # BERT-base at 16 workers, 1/10/25/100 Gbps
    python benchmarks/planning_speed.py --models resnet50,gpt2 --workers 8,16 --out out/speed
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from casync.table import format_table, markdown_table

CHILD = """
import json, sys, time
import casync
from casync.sim.costmodel import ClusterModel
model, workers, gbps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
cluster = ClusterModel.for_workers(workers, bandwidth_gbps=gbps)
start = time.perf_counter()
plan = casync.build_plan(model, workers=workers, strategy="auto", codec="auto", partitions="auto", cluster=cluster)
wall = time.perf_counter() - start
info = plan.options["planner"]
print(json.dumps(dict(wall_s=wall, simulations=info["simulations"], chosen=info["chosen"],
                      simulated_s=info["simulated_s"], ops=plan.graph.number_of_nodes())))
"""


def plan_once(model: str, workers: int, gbps: float) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(workers), str(gbps)], check=True,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert-base")
    parser.add_argument("--workers", default="16")
    parser.add_argument("--gbps", default="1,10,25,100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    rows, raw = [], []
    started = time.time()
    for model in args.models.split(","):
        for workers in map(int, args.workers.split(",")):
            for gbps in map(float, args.gbps.split(",")):
                runs = [plan_once(model, workers, gbps) for _ in range(args.repeats)]
                walls = [r["wall_s"] for r in runs]
                raw.append(dict(model=model, workers=workers, gbps=gbps, runs=runs))
                rows.append([model, workers, f"{gbps:g}", f"{statistics.median(walls):.2f}", f"{max(walls):.2f}",
                             runs[0]["simulations"], f"{runs[0]['ops']:,}", runs[0]["chosen"],
                             f"{runs[0]['simulated_s'] * 1e3:.1f}"])
                print(format_table(["model", "workers", "Gbps", "median s", "max s", "sims", "plan ops", "chosen",
                                    "simulated ms"], rows[-1:]), flush=True)
    header = ["model", "workers", "Gbps", "median s", "max s", "simulations", "plan ops", "chosen", "simulated ms"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = ("# Planning speed\n\n"
            "Wall time of `casync.build_plan(model, workers=N, strategy=\"auto\", codec=\"auto\", "
            "partitions=\"auto\", cluster=ClusterModel.for_workers(N, bandwidth_gbps=G))`, each call in a fresh "
            f"process (imports not timed), {args.repeats} calls per row, on {os.cpu_count()} cores "
            f"(load average {load:.1f} at the end).\n\n"
            f"```\npython benchmarks/planning_speed.py --models {args.models} --workers {args.workers} "
            f"--gbps {args.gbps} --repeats {args.repeats}\n```\n\n"
            + markdown_table(header, rows) + f"\n\nTotal {time.time() - started:.0f} s.\n")
    (out / "planning_speed.md").write_text(text)
    (out / "planning_speed.json").write_text(json.dumps(raw, indent=1) + "\n")
    print(f"wrote {out / 'planning_speed.md'}")


if __name__ == "__main__":
    main()
