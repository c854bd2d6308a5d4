"""Soak: many syncs of a small plan on RayEngine, and many engine open/close cycles, watching for leaks.

Samples, every ``--sample-every`` iterations: the driver's RSS, the sync actors' RSS, the object store's bytes
and objects, and the ObjectRefs the driver holds.  Then ``--cycles`` engine open/close cycles, counting live
actors, placement groups, driver refs and store objects before and after.  At the end the soak's final results
and error-feedback state are replayed on LocalEngine and compared bit for bit (nothing lost on the way).

    python benchmarks/soak.py                      # 10,000 iterations, 100 cycles (several minutes)
    python benchmarks/soak.py --iters 500 --cycles 5 --out /tmp/soak   # a quick look

Writes ``<out>.json`` and ``<out>.md`` (default ``benchmarks/results/soak``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import ray

import casync
from casync.runtime.ray_engine import RayEngine
from casync.runtime.ray_layer import connect_ray

SHAPES = {"layer1.weight": (256, 128), "layer1.bias": (128,), "layer2.weight": (128, 10), "layer2.bias": (10,)}
POOL = 8  # distinct gradient sets, used in rotation (the replay knows which step used which)
MiB = 2**20


def rss_mib(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default), from /proc (Linux)."""
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc: soak.py measures memory on Linux only")


def pool_grads(workers: int) -> list[list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    return [[{n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()} for _ in range(workers)]
            for _ in range(POOL)]


def store_stats() -> tuple[int, int]:
    """(bytes used, objects) in the object store, over all nodes, as the raylet reports them."""
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used), int(reply.store_stats.num_local_objects)


def driver_refs() -> int:
    return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


def alive_actors() -> int:
    return sum(a["State"] == "ALIVE" for a in ray._private.state.actors().values())


def live_placement_groups() -> int:
    return sum(pg["state"] != "REMOVED" for pg in ray.util.placement_group_table().values())


def soak(plan: casync.SyncPlan, iters: int, every: int) -> tuple[list[dict], float, list, dict]:
    grads = pool_grads(plan.workers)
    samples = []
    with RayEngine(plan, timeout_s=120) as engine:
        actor_pids = ray.get([a.pid.remote() for a in engine.actors.values()])
        started = time.perf_counter()
        for i in range(iters):
            out = engine.sync(grads[i % POOL])
            if i % every == 0 or i == iters - 1:
                del out
                gc.collect()
                used, objects = store_stats()
                samples.append(dict(iteration=i, seconds=time.perf_counter() - started,
                                    driver_rss_mib=rss_mib(),
                                    actors_rss_mib=sum(rss_mib(pid) for pid in actor_pids),
                                    store_used_mib=used / MiB, store_objects=objects, driver_refs=driver_refs()))
                print(f"  {i:6d}  driver {samples[-1]['driver_rss_mib']:7.1f} MiB  actors "
                      f"{samples[-1]['actors_rss_mib']:7.1f} MiB  store {used / MiB:6.2f} MiB / {objects} objects"
                      f"  refs {samples[-1]['driver_refs']}", flush=True)
        elapsed = time.perf_counter() - started
        last = engine.sync(grads[iters % POOL])
        state = engine.state_dict()
    return samples, elapsed, last, state


def replay(plan: casync.SyncPlan, iters: int, ray_last, ray_state) -> bool:
    """The same iters+1 steps on LocalEngine: the last result and the residuals must match bit for bit."""
    grads = pool_grads(plan.workers)
    local = casync.LocalEngine(plan)
    for i in range(iters):
        local.sync(grads[i % POOL])
    expected = local.sync(grads[iters % POOL])
    state = local.state_dict()
    same = all(np.array_equal(ray_last[w][n], expected[w][n]) for w in range(plan.workers) for n in SHAPES)
    same &= state["step"] == ray_state["step"] and state["residuals"].keys() == ray_state["residuals"].keys()
    return bool(same and all(np.array_equal(v, ray_state["residuals"][k]) for k, v in state["residuals"].items()))


def cycles(plan: casync.SyncPlan, n: int) -> dict:
    grads = pool_grads(plan.workers)[0]

    def snapshot() -> dict:
        gc.collect()
        # the GCS and the object store free asynchronously: a closed engine's last gradients leave the store
        # 0.5-2 s after close here, so wait up to 10 s for them
        time.sleep(0.5)
        used, objects = store_stats()
        deadline = time.monotonic() + 10
        while objects and time.monotonic() < deadline:
            time.sleep(0.25)
            used, objects = store_stats()
        return dict(alive_actors=alive_actors(), placement_groups=live_placement_groups(), driver_refs=driver_refs(),
                    store_objects=objects, store_used_mib=used / MiB, driver_rss_mib=rss_mib())

    before = snapshot()
    peak_actors = 0
    started = time.perf_counter()
    for i in range(n):
        with RayEngine(plan, timeout_s=120) as engine:
            engine.sync(grads)
            peak_actors = max(peak_actors, alive_actors())
        if (i + 1) % 10 == 0:
            print(f"  cycle {i + 1}: {alive_actors()} actors alive, {driver_refs()} driver refs", flush=True)
    elapsed = time.perf_counter() - started
    after = snapshot()
    return dict(cycles=n, seconds=elapsed, before=before, after=after, actors_per_engine=len(plan.actors),
                peak_alive_actors=peak_actors)


def ray_baseline(calls: int, iters: int) -> dict:
    """The driver's RSS over ``iters`` iterations of plain Ray with as many actor calls per iteration as a sync
    makes (chained, small NumPy payloads, no casync): how much growth is Ray's own."""
    @ray.remote(num_cpus=0.1)
    class Echo:
        def call(self, *args):
            return np.ones(1000, np.float32)

    actors = [Echo.remote() for _ in range(4)]
    x = np.ones(40_000, np.float32)

    def iteration() -> None:
        refs = []
        for k in range(calls):
            refs.append(actors[k % 4].call.remote(x if k < 4 else refs[-1]))
        ray.get(refs)

    for _ in range(max(1, iters // 10)):  # warm-up, as the soak's first 10%
        iteration()
    gc.collect()
    before = rss_mib()
    for _ in range(iters):
        iteration()
    gc.collect()
    after = rss_mib()
    for a in actors:
        ray.kill(a)
    return dict(calls_per_iteration=calls, iterations=iters, driver_rss_before_mib=before, driver_rss_after_mib=after,
                per_1k_iters=(after - before) / iters * 1000)


def slope_per_1k(samples: list[dict], key: str) -> float:
    """Least-squares growth of ``key`` per 1,000 iterations, after the first 10% (warm-up)."""
    start = max(1, len(samples) // 10)
    xs = np.array([s["iteration"] for s in samples[start:]], float)
    ys = np.array([s[key] for s in samples[start:]], float)
    return float(np.polyfit(xs, ys, 1)[0] * 1000) if len(xs) > 2 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10_000)
    parser.add_argument("--sample-every", type=int, default=250)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results/soak")
    args = parser.parse_args()

    connect_ray(None, num_cpus=max(2, os.cpu_count() or 2), object_store_memory=256 * MiB)
    plan = casync.build_plan(SHAPES, workers=args.workers, strategy="ring", codec="onebit", bucket_bytes=1 << 16)
    print(f"soak: {plan!r}, {args.iters} iterations", flush=True)
    samples, elapsed, last, state = soak(plan, args.iters, args.sample_every)
    print("replaying on LocalEngine ...", flush=True)
    identical = replay(plan, args.iters, last, state)
    print(f"cycles: {args.cycles} engine open/close", flush=True)
    cyc = cycles(plan, args.cycles)
    with RayEngine(plan) as engine:
        calls = engine.calls_per_step
    print(f"plain Ray baseline: {calls} actor calls per iteration", flush=True)
    baseline = ray_baseline(calls, args.iters // 2)
    ray.shutdown()

    steady = samples[max(1, len(samples) // 10):]
    half = len(steady) // 2
    summary = {key: dict(first=steady[0][key], last=steady[-1][key], min=min(s[key] for s in steady),
                         max=max(s[key] for s in steady), per_1k_iters=slope_per_1k(samples, key),
                         first_half_mean=float(np.mean([s[key] for s in steady[:half] or steady])),
                         second_half_mean=float(np.mean([s[key] for s in steady[half:]])))
               for key in ("driver_rss_mib", "actors_rss_mib", "store_used_mib", "store_objects", "driver_refs")}
    # flat: the second half of the run holds no more than the first, within these tolerances
    tolerance = {"driver_rss_mib": 8.0, "actors_rss_mib": 32.0, "store_used_mib": 8.0, "store_objects": 32,
                 "driver_refs": 0}
    growth = {k: summary[k]["second_half_mean"] - summary[k]["first_half_mean"] for k in tolerance}
    flat = all(growth[k] <= tolerance[k] for k in tolerance)
    no_leak = all(cyc["after"][k] <= cyc["before"][k] for k in ("alive_actors", "placement_groups", "driver_refs",
                                                                  "store_objects"))
    result = dict(plan=repr(plan), iterations=args.iters, seconds=elapsed, ms_per_iteration=1e3 * elapsed / args.iters,
                  machine=dict(cpus=os.cpu_count(), platform=platform.platform(), ray=ray.__version__),
                  summary=summary, growth_second_vs_first_half=growth, tolerance=tolerance, memory_flat=flat, replay_bit_identical=identical, cycles=cyc,
                  cycles_leak_free=no_leak, ray_baseline=baseline, samples=samples)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(result) + "\n")
    print(report(result))


def report(r: dict) -> str:
    s = r["summary"]
    lines = [f"# Soak: {r['iterations']:,} syncs of {r['plan']} on RayEngine", "",
             f"{r['seconds']:.0f} s, {r['ms_per_iteration']:.2f} ms per sync on {r['machine']['cpus']} CPUs "
             f"(Ray {r['machine']['ray']}). Command: `python benchmarks/soak.py --iters {r['iterations']} "
             f"--cycles {r['cycles']['cycles']}`.", "",
             "| measure (after the first 10% as warm-up) | first | last | min | max | 2nd half - 1st half (mean) "
             "| tolerance | slope per 1,000 syncs |",
             "|---|---|---|---|---|---|---|---|"]
    names = {"driver_rss_mib": "driver RSS, MiB", "actors_rss_mib": "sync actors' RSS (sum), MiB",
             "store_used_mib": "object store used, MiB", "store_objects": "object store objects",
             "driver_refs": "ObjectRefs held by the driver"}
    for key, label in names.items():
        v = s[key]
        lines.append(f"| {label} | {v['first']:.2f} | {v['last']:.2f} | {v['min']:.2f} | {v['max']:.2f} | "
                     f"{r['growth_second_vs_first_half'][key]:+.2f} | {r['tolerance'][key]} | {v['per_1k_iters']:+.3f} |")
    c, b = r["cycles"], r["ray_baseline"]
    lines += ["", f"Plain Ray with the same {b['calls_per_iteration']} actor calls per iteration and no casync "
                  f"(`ray_baseline`): driver RSS {b['driver_rss_before_mib']:.1f} -> {b['driver_rss_after_mib']:.1f} MiB "
                  f"over {b['iterations']:,} iterations, {b['per_1k_iters']:+.3f} MiB per 1,000, against "
                  f"{s['driver_rss_mib']['per_1k_iters']:+.3f} MiB per 1,000 for the casync driver above."]
    lines += ["", f"Memory flat: **{'yes' if r['memory_flat'] else 'NO'}**. Final results and error-feedback "
                  f"residuals replayed on LocalEngine: **{'bit-identical' if r['replay_bit_identical'] else 'DIFFERENT'}**.",
              "", f"## {c['cycles']} engine open/close cycles ({c['actors_per_engine']} actors each, {c['seconds']:.0f} s)",
              "", "| | alive actors | placement groups | driver ObjectRefs | store objects | store MiB | driver RSS MiB |",
              "|---|---|---|---|---|---|---|"]
    for when in ("before", "after"):
        v = c[when]
        lines.append(f"| {when} | {v['alive_actors']} | {v['placement_groups']} | {v['driver_refs']} | "
                     f"{v['store_objects']} | {v['store_used_mib']:.2f} | {v['driver_rss_mib']:.1f} |")
    lines += ["", f"Leak-free: **{'yes' if r['cycles_leak_free'] else 'NO'}** (peak {c['peak_alive_actors']} actors "
                  "alive during a cycle)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
