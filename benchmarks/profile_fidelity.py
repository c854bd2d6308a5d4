"""How well a profile prices the ops of a sync: simulated op CPU per worker against what the engines' ops took.

    python benchmarks/profile_fidelity.py [--profiles packaged,benchmarks/results/profile/profile_before_dataplane.json]
                                          [--configs ring/none,ring/onebit,ps-twoway/randomk:ratio=0.01,...]
                                          [--iters 5] [--out benchmarks/results/profile]

ResNet-50's gradients, 4 workers, each configuration built as ``casync bench`` builds it.  Per configuration:

* **simulated**: the compute of one sync per worker (``casync.simulate`` on four nodes with a core each, no
  runtime costs: the profile's op prices alone), per profile;
* **LocalEngine**: the ops' own CPU per worker (each op's thread time), one process, median over ``--iters``
  syncs after ``WARMUP_SYNCS`` warm-ups;
* **RayEngine**: the same on 4 actors of an embedded local Ray over the direct data plane (on this 2-core
  machine the actors share cores, so their ops also pay for each other's cache traffic).

A ratio of 1 means the profile prices the ops as they run.  The simulator folds a decode into the merge that
reads it and a merge into the error-feedback encode that takes it, as the engine does, so per-sync totals
compare directly.
"""
from __future__ import annotations

import argparse
import statistics
import time

from casync.bench.predict import make_plan
from casync.bench.setup import local_setup
from casync.datasets.gradients import bucket_layout, make_bucket_buffers
from casync.engines.memory import WARMUP_SYNCS
from casync.sim.costmodel import ClusterModel, Profile
from casync.sim.simulator import simulate
from casync.table import markdown_table
from result_files import write_results

CONFIGS = ("ring/none", "ring/onebit", "ps-twoway/randomk:ratio=0.01", "allgather/topk:ratio=0.01")
COMPUTE = ("encode", "decode", "merge")


def simulated_ms(plan, profile: Profile) -> float:
    """Compute per worker of one sync, priced by ``profile`` alone (no runtime model), in ms."""
    cluster = ClusterModel(nodes=plan.workers, workers_per_node=1, bandwidth_gbps=1000, latency_us=1)
    timeline = simulate(plan, cluster, profile.with_runtime(None))
    return 1e3 * statistics.mean(timeline.busy(f"worker:{w}/compute0") for w in range(plan.workers))


def op_cpu_ms(rows, workers: int) -> float:
    """The ops' own CPU per worker in one sync's timeline rows, in ms."""
    return 1e3 * sum(r["cpu"] or 0.0 for r in rows if r["op"] in COMPUTE and r["actor"].startswith("worker:")) / workers


def measure_local(plan, iters: int) -> list[float]:
    from casync.engines.local import LocalEngine

    layout = bucket_layout(plan)
    flats = [make_bucket_buffers("resnet50", w, 0, layout) for w in range(plan.workers)]
    engine, out = LocalEngine(plan), []
    for i in range(WARMUP_SYNCS + iters):
        engine.run_flat(flats)
        if i >= WARMUP_SYNCS:
            out.append(op_cpu_ms(engine.timeline(step=i), plan.workers))
    return out


def measure_ray(plan, iters: int) -> list[float]:
    from casync.runtime.calibrate import measure_timelines

    return [op_cpu_ms(rows, plan.workers) for rows in measure_timelines(plan, iters, transport="direct")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profiles", default="packaged,benchmarks/results/profile/profile_before_dataplane.json",
                   help="comma-separated: 'packaged' or profile JSON paths")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--out", default="benchmarks/results/profile")
    args = p.parse_args()
    import ray

    started = time.time()
    profiles = {name: Profile.default() if name == "packaged" else Profile.load(name)
                for name in args.profiles.split(",")}
    cluster = local_setup().cluster_model(args.workers)
    ray.init(num_cpus=args.workers, include_dashboard=False, object_store_memory=2 * 10**9)
    rows, raw = [], {"configs": {}, "profiles": list(profiles), "iters": args.iters, "workers": args.workers}
    try:
        for config in args.configs.split(","):
            strategy, codec = config.split("/")
            plan = make_plan("resnet50", args.workers, strategy, codec, (codec,), cluster)
            sims = {name: simulated_ms(plan, prof) for name, prof in profiles.items()}
            local, actors = measure_local(plan, args.iters), measure_ray(plan, args.iters)
            lo, ra = statistics.median(local), statistics.median(actors)
            raw["configs"][config] = {"simulated_ms": sims, "local_ms": local, "ray_ms": actors}
            rows.append([config, f"{lo:.1f}", f"{ra:.1f} ({min(actors):.1f}–{max(actors):.1f})"]
                        + [f"{s:.1f} (×{lo / s:.2f} / ×{ra / s:.2f})" for s in sims.values()])
            print(rows[-1], flush=True)
    finally:
        ray.shutdown()
    seconds = time.time() - started
    command = "python benchmarks/profile_fidelity.py " + " ".join(
        f"--{k} {v}" for k, v in [("profiles", args.profiles), ("iters", args.iters), ("out", args.out)])
    text = (f"# Profile fidelity: simulated op CPU against the engines' ops\n\nGenerated "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {seconds:.0f} s by\n\n```\n{command}\n```\n\n"
            f"ResNet-50, {args.workers} workers. Ops' own CPU per worker and sync, ms: LocalEngine (one process) and "
            f"RayEngine ({args.workers} actors, direct plane, range over syncs), medians of {args.iters} syncs after "
            f"{WARMUP_SYNCS} warm-ups; simulated with each profile alone, (× measured / simulated: LocalEngine / "
            "RayEngine).\n\n"
            + markdown_table(["configuration", "LocalEngine", "RayEngine"] + [f"simulated: {n}" for n in profiles],
                             rows)
            + "\n")
    print(write_results(args.out, "profile_fidelity", text, raw))


if __name__ == "__main__":
    main()
