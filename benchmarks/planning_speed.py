"""How long ``build_plan(strategy="auto", codec="auto", partitions="auto")`` takes to choose a plan.

Each planning call runs in a fresh Python process (nothing cached from an earlier call, imports excluded
from the time), ``--repeats`` times per (model, workers, bandwidth); the table gives the median and the
slowest wall time of the whole ``build_plan`` call (the returned plan assembled), the median CPU time of
the process (less disturbed by other load on a shared machine), how much of it the planner's own
``seconds`` were, and what it chose.

    python benchmarks/planning_speed.py                      # BERT-base at 16 and 64 workers, 1/10/25/100 Gbps
    python benchmarks/planning_speed.py --models resnet50,gpt2 --workers 8,16 --out out/speed
    python benchmarks/planning_speed.py --baseline /path/to/other/checkout   # + its time, interleaved: the ratio

``--baseline DIR`` runs every call a second time with ``DIR`` first on ``PYTHONPATH`` (another checkout of
casync), alternating with this one, and adds the median wall time there and the ratio of the medians: on a
shared machine whose load drifts, a ratio measured in one run is the comparison to trust.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from casync.table import format_table, markdown_table
from result_files import write_results

CHILD = """
import json, sys, time
import casync
import casync.planner  # build_plan imports the planner lazily; imports are not timed
from casync.sim.costmodel import ClusterModel
print(casync.__file__, file=sys.stderr)
model, workers, gbps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
cluster = ClusterModel.for_workers(workers, bandwidth_gbps=gbps)
start, cpu = time.perf_counter(), time.process_time()
plan = casync.build_plan(model, workers=workers, strategy="auto", codec="auto", partitions="auto", cluster=cluster)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
info = plan.options["planner"]
print(json.dumps(dict(wall_s=wall, cpu_s=cpu, planner_s=info.get("choose_s", info["seconds"]),
                      simulations=info["simulations"],
                      chosen=info["chosen"], simulated_s=info["simulated_s"], ops=plan.graph.number_of_nodes())))
"""


def plan_once(model: str, workers: int, gbps: float, path: str | None = None) -> dict:
    env = dict(os.environ, PYTHONHASHSEED="0")
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([path] + [p for p in [env.get("PYTHONPATH")] if p])
    # (cwd: "python -c" puts the working directory first on sys.path, ahead of PYTHONPATH)
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(workers), str(gbps)], check=True,
                         capture_output=True, text=True, env=env, cwd=path)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert-base")
    parser.add_argument("--workers", default="16,64")
    parser.add_argument("--gbps", default="1,10,25,100")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/planning_speed")
    parser.add_argument("--baseline", default=None, help="another casync checkout to time alongside (interleaved)")
    args = parser.parse_args()
    header = HEADER + (["baseline median s", "speed-up"] if args.baseline else [])
    rows, raw = [], []
    started = time.time()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for model in args.models.split(","):
        for workers in map(int, args.workers.split(",")):
            for gbps in map(float, args.gbps.split(",")):
                runs, base = [], []
                for _ in range(args.repeats):
                    runs.append(plan_once(model, workers, gbps))
                    if args.baseline:
                        base.append(plan_once(model, workers, gbps, args.baseline)["wall_s"])
                walls = [r["wall_s"] for r in runs]
                cpus = [r["cpu_s"] for r in runs]
                planner = [r["planner_s"] for r in runs]
                raw.append(dict(model=model, workers=workers, gbps=gbps, runs=runs, baseline_wall_s=base))
                rows.append([model, workers, f"{gbps:g}", f"{statistics.median(walls):.2f}", f"{max(walls):.2f}",
                             f"{statistics.median(cpus):.2f}", f"{statistics.median(planner):.2f}",
                             runs[0]["simulations"], f"{runs[0]['ops']:,}", runs[0]["chosen"],
                             f"{runs[0]['simulated_s'] * 1e3:.1f}"]
                            + ([f"{statistics.median(base):.2f}",
                                f"{statistics.median(base) / statistics.median(walls):.1f}x"] if base else []))
                print(format_table(header, rows[-1:]), flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = ("# Planning speed\n\n"
            "Wall time of `casync.build_plan(model, workers=N, strategy=\"auto\", codec=\"auto\", "
            "partitions=\"auto\", cluster=ClusterModel.for_workers(N, bandwidth_gbps=G))`, each call in a fresh "
            f"process (imports not timed), {args.repeats} calls per row, on {os.cpu_count()} cores "
            f"(load average {load_start:.1f} at the start, {load:.1f} at the end). *median s*, *max s*: wall time "
            "of the whole call, the returned plan assembled; *cpu s*: the process's CPU time (median); "
            "*planner s*: of which choosing (before assembling the returned plan).\n\n"
            f"```\npython benchmarks/planning_speed.py --models {args.models} --workers {args.workers} "
            f"--gbps {args.gbps} --repeats {args.repeats}"
            + (f" --baseline {args.baseline}" if args.baseline else "") + "\n```\n\n"
            + (f"*baseline*: the same calls with `{args.baseline}` on PYTHONPATH, alternating with these; "
               "*speed-up*: baseline median / median.\n\n" if args.baseline else "")
            + markdown_table(header, rows) + f"\n\nTotal {time.time() - started:.0f} s.\n")
    md = write_results(args.out, "planning_speed", text, raw)
    print(f"wrote {md}")


HEADER = ["model", "workers", "Gbps", "median s", "max s", "cpu s", "planner s", "simulations", "plan ops", "chosen",
          "simulated ms"]

if __name__ == "__main__":
    main()
