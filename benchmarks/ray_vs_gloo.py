#!/usr/bin/env python
"""Where RayEngine's sync span goes, against gloo all_reduce and the simulator, on one machine.

    python benchmarks/ray_vs_gloo.py [--iters 5] [--workers 4] [--out benchmarks/results/one_machine_breakdown]
                                     [--configs ring/none,ring/onebit,ps-twoway/randomk:ratio=0.01]
                                     [--transport NAME[,NAME...]] [--rounds 1] [--model resnet50]

Measured side by side in one run, on the same gradients (``casync.datasets.gradients``: worker w's gradient is
seeded by (seed, w)), mean over workers:

* **RayEngine**, one fresh engine per configuration (``strategy/codec``, strategy labels as in
  ``casync bench``) on an embedded local Ray; gradients made on the actors' node by
  ``casync.bench.measure.GradientStore``.  The *sync span* is the engine's timeline from the first op of
  any worker to the last op of any worker (``casync.bench.measure.sync_span``); median over ``--iters``
  syncs after ``WARMUP_SYNCS`` warm-ups (``--rounds R``: all configurations R times, syncs pooled).  Each span is
  cut into categories that add up (``benchmarks/ray_breakdown.py``: RayEngine's per-op rows with their CPU
  time, and Ray's task events), and the CPU seconds of the driver, the actors, Ray's processes and the
  rest of the machine in the span are read from /proc, sampled every 10 ms.
* **gloo**: ``casync.bench.baselines.run_baselines`` with ``gloo-bucket`` (all_reduce of 25 MiB buckets,
  what DDP does) and ``gloo-tensor`` (one all_reduce per tensor), 4 processes on loopback, barrier to
  barrier; run before the first round and after every round (without Ray up), ratios against the median
  of all.
* **simulator**: ``casync.simulate(plan, ClusterModel(nodes=1, workers_per_node=W, cores_per_node=<cores>))``
  with the packaged profile, the same plans.

``--transport``: passed to ``RayEngine(transport=...)`` when RayEngine has that parameter (one engine per
transport and configuration); without it, the engine's default.  Writes ``<out>/ray_vs_gloo.md`` and
``<out>/ray_vs_gloo.json``.  Ray and the gloo processes are stopped at the end, on error too.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # ray_breakdown, next to this script
try:  # an installed casync or one on PYTHONPATH wins
    import casync  # noqa: F401
except ImportError:  # a checkout without `pip install -e .` (Ray hands this sys.path to its workers)
    sys.path.insert(0, str(ROOT.parent))

import ray_breakdown as rb

from casync.bench.baselines import BASELINES, run_baselines
from casync.bench.measure import GradientStore, sync_span
from casync.bench.predict import make_plan, predict
from casync.bench.runner import machine_info
from casync.bench.setup import local_setup
from casync.datasets.gradients import exact_mean, model_numel
from casync.engines.memory import WARMUP_SYNCS
from casync.sim.costmodel import Profile
from casync.table import markdown_table

CONFIGS = ("ring/none", "ring/onebit", "ps-twoway/randomk:ratio=0.01")
GLOO = ("gloo-bucket", "gloo-tensor")
#: Ray's workers report task events to the GCS about once a second
TASK_EVENTS_DELAY_S = 2.5


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def engine_options(transport: str | None) -> dict[str, Any]:
    """RayEngine keyword arguments for ``transport`` (None: the engine's default)."""
    from casync.runtime.ray_engine import RayEngine

    if transport is None:
        return {}
    if "transport" not in inspect.signature(RayEngine).parameters:
        raise SystemExit(f"--transport {transport}: this RayEngine has no transport parameter (payloads go through "
                         "Ray's object store only); run without --transport")
    return {"transport": transport}


# -- RayEngine ---------------------------------------------------------------------------------------------

def measure_engine(plan, store: GradientStore, exact: np.ndarray, iters: int,
                   options: dict[str, Any]) -> dict[str, Any]:
    """``WARMUP_SYNCS + iters`` syncs of ``plan`` on a fresh RayEngine; per timed sync: span, wall, CPU,
    breakdown."""
    import ray

    from casync.runtime.ray_engine import RayEngine

    with RayEngine(plan, timeout_s=600.0, **options) as engine:
        ids = {name: handle._actor_id.hex() for name, handle in engine.actors.items()}
        nodes = engine.actor_nodes()
        flats = store.refs(plan, [nodes[f"worker:{w}"] for w in range(plan.workers)])
        groups = rb.process_groups(ray.get([h.pid.remote() for h in engine.actors.values()]))
        syncs, consistent, rel_error = [], True, float("nan")
        with rb.CpuSampler(groups) as sampler:
            for i in range(WARMUP_SYNCS + iters):
                t0 = time.time()
                results = engine.run_flat(flats)
                t1 = time.time()
                consistent &= all(np.array_equal(results[0][b], r[b]) for r in results[1:] for b in results[0])
                if i == 0:
                    got = np.concatenate([results[0][b.name] for b in plan.buckets])
                    rel_error = float(np.linalg.norm(got - exact) / np.linalg.norm(exact))
                del results
                if i >= WARMUP_SYNCS:
                    rows = engine.timeline(engine.step - 1, relative=getattr(engine, "program", None) is not None)
                    syncs.append({"window": (t0, t1), "wall_s": t1 - t0, "span_s": sync_span(rows), "rows": rows})
        if getattr(engine, "program", None) is None:  # the direct data plane: one call per actor, no Ray tasks to read
            for s in syncs:
                s["breakdown"] = rb.executor_breakdown(s.pop("rows"), engine.calls_per_step)
                s["cpu"] = sampler.between(*s["breakdown"]["span"])
                s["cpu"]["ops"] = sum(a["op_cpu"] for a in s["breakdown"]["per_actor"].values())
                s["submit_s"] = s["submitted_before_first_op_s"] = 0.0
            return {"syncs": syncs, "consistent": consistent, "rel_error": rel_error}
        time.sleep(TASK_EVENTS_DELAY_S)
        tasks, submits = rb.ray_tasks(ids.values(), syncs[0]["window"][0], syncs[-1]["window"][1])
        for s in syncs:
            lo, hi = s["window"]
            mine = [t for t in tasks if lo <= t.created <= hi]
            s["breakdown"] = rb.sync_breakdown(s.pop("rows"), mine, ids, getattr(engine, "program", None))
            s["cpu"] = sampler.between(*s["breakdown"]["span"])
            s["cpu"]["ops"] = sum(a["op_cpu"] for a in s["breakdown"]["per_actor"].values())
            subs = [(a, b) for a, b in submits if lo <= a <= hi]
            s["submit_s"] = sum(b - a for a, b in subs)
            s["submitted_before_first_op_s"] = s["breakdown"]["span"][0] - max((b for _, b in subs), default=lo)
        return {"syncs": syncs, "consistent": consistent, "rel_error": rel_error}


def summarize(run: dict[str, Any]) -> None:
    """Add the medians over a configuration's timed syncs (all rounds) and the index of the median sync."""
    syncs = run["syncs"]
    median = sorted(range(len(syncs)), key=lambda i: syncs[i]["span_s"])[len(syncs) // 2]
    run.update(spans_s=[s["span_s"] for s in syncs], walls_s=[s["wall_s"] for s in syncs],
               span_s=statistics.median(s["span_s"] for s in syncs),
               wall_s=statistics.median(s["wall_s"] for s in syncs),
               ray_calls=syncs[median]["breakdown"]["calls"], median_index=median,
               cpu={k: statistics.fmean(s["cpu"][k] for s in syncs) for k in syncs[0]["cpu"]})  # 10 ms ticks: a mean


def send_bytes(plan) -> float:
    """Payload bytes each actor sends per sync, mean over actors (what its calls store for others)."""
    sends = [a["nbytes"] for _, a in plan.graph.nodes(data=True) if a["op"] == "send"]
    return sum(sends) / len(plan.actors)


def predicted(plan, cluster, profile=None) -> dict[str, float]:
    """The simulator's span and, per actor on average, its compute-lane and egress-lane (transfer) seconds."""
    timeline = predict(plan, cluster, profile)
    per_kind: dict[str, float] = {}
    for r in timeline.records:
        kind = r["lane"].split("/")[-1].rstrip("0123456789")
        per_kind[kind] = per_kind.get(kind, 0.0) + (r["end"] - r["start"]) / len(plan.actors)
    return {"span_s": timeline.sync_time(), "compute_s": per_kind.get("compute", 0.0),
            "transfer_s": per_kind.get("egress", 0.0)}


# -- the report ----------------------------------------------------------------------------------------------

def ray_cpu(c: dict[str, float]) -> float:
    """CPU seconds of Ray's own machinery in a span: the actors outside their ops, the driver, raylet, GCS."""
    return c["actors"] - c["ops"] + c["driver"] + c["raylet"] + c["gcs_server"] + c["other Ray"]


def median_sync(run: dict[str, Any]) -> dict[str, Any]:
    """The sync with the median span: its breakdown adds up to the median span."""
    return run["syncs"][run["median_index"]]


def ms(x: float | None) -> Any:
    return "" if x is None else round(x * 1e3, 1)


def per_call_figures(run: dict[str, Any]) -> dict[str, Any]:
    """Per Ray call and per sync (the median sync), and the simulator's per-actor figures next to the measured."""
    sync = median_sync(run)
    b, mean = sync["breakdown"], sync["breakdown"]["mean"]
    calls = b["calls"] / run["actors"]  # per actor
    worst = min((s["breakdown"] for s in run["syncs"]), key=lambda x: x["matched"] / x["ops"])
    in_call = sum(mean[k] for k in ("deserialize", "store", "task_loop", "between_ops"))
    if not mean["store"]:  # the direct data plane: nothing goes through the object store
        return {"Ray calls per actor per sync": round(calls, 1),
                "payload MB each actor sends per sync": round(run["send_bytes"] / 1e6, 1),
                "actors' minor page faults per MB sent": round(run["cpu"]["actors faults"]
                                                               / max(run["send_bytes"] * run["actors"] / 1e6, 1e-9)),
                "executor's own time between ops per actor, ms": ms(mean["between_ops"]),
                "idle waiting for payloads per actor, ms": ms(mean["wait_inputs"]),
                "ops' wall per actor, ms (measured)": ms(mean["op_cpu"] + mean["op_wait"] + mean["op_blocked"]),
                "ops' compute per actor, ms (simulator)": ms(run["sim"]["compute_s"]),
                "transfers per actor, ms (simulator's egress lane)": ms(run["sim"]["transfer_s"])}
    return {
        "Ray calls per actor per sync": round(calls, 1),
        "op rows matched to a Ray call (worst sync)": f"{worst['matched']}/{worst['ops']}",
        "payload MB each actor stores per sync": round(run["send_bytes"] / 1e6, 1),
        "store: MB/s into the object store": round(run["send_bytes"] / 1e6 / max(mean["store"], 1e-9)),
        "actors' minor page faults per MB stored": round(run["cpu"]["actors faults"]
                                                         / max(run["send_bytes"] * run["actors"] / 1e6, 1e-9)),
        "ms per call: deserialize + store + task loop + between ops": round(1e3 * in_call / calls, 2),
        "ms per call: idle owner + delivery": round(1e3 * (mean["owner"] + mean["delivery"]) / calls, 2),
        "Ray's CPU per Ray call, ms (actors outside ops, driver, raylet, GCS)": round(
            1e3 * ray_cpu(run["cpu"]) / b["calls"], 2),
        "driver: ms in submit_task per sync": ms(sync["submit_s"]),
        "driver: last submit_task ended, ms before the first op (< 0: after)": ms(sync["submitted_before_first_op_s"]),
        "ops' wall per actor, ms (measured)": ms(mean["op_cpu"] + mean["op_wait"] + mean["op_blocked"]),
        "ops' compute per actor, ms (simulator)": ms(run["sim"]["compute_s"]),
        "store per actor, ms (measured)": ms(mean["store"]),
        "transfers per actor, ms (simulator's egress lane)": ms(run["sim"]["transfer_s"]),
    }


def cpu_rows(run: dict[str, Any]) -> dict[str, float]:
    """CPU seconds in the span (mean over syncs) by who used them; they add up to cores x span."""
    c = run["cpu"]
    main = c["actor thread on CPU"]
    return {"actors: ops": c["ops"], "actors: main thread outside ops (Ray's task path)": main - c["ops"],
            "actors: other threads (Ray's RPC/IO)": max(0.0, c["actors"] - main), "driver": c["driver"],
            "raylet (plasma store, scheduling)": c["raylet"],
            "gcs_server + other Ray": c["gcs_server"] + c["other Ray"],
            "outside (other processes, interrupts)": c["outside"], "idle": c["idle"]}


def render(result: dict[str, Any]) -> str:
    """The Markdown report of one run (also re-renderable from its JSON)."""
    m, runs, gloo, rounds = result["machine"], result["runs"], result["gloo"], result["rounds"]
    ref = {name: statistics.median(t for g in gloo for t in g[name]["sync_s"]) for name in GLOO}
    L = ["# Where RayEngine's time goes: RayEngine vs gloo all_reduce vs the simulator", "",
         f"Generated {result['date']} in {result['seconds']:.0f} s by", "", f"```\n{result['command']}\n```", "",
         f"Machine: {m['cores']} cores ({m['cpu']}), load average at start {m.get('loadavg_at_start')}; Python "
         f"{m['python']}, NumPy {m['numpy']}, torch {m['torch']}, Ray {m['ray']}; {m['platform']}. Shared and "
         "noisy: absolute times move by tens of percent between runs; the ratios below come from this one run.", "",
         f"Workload: `{result['model']}`, {result['numel'] / 1e6:.1f}M floats ({result['numel'] * 4 / 1e6:.0f} MB) "
         f"per worker, {result['workers']} workers, mean. Sync span = the engine's timeline from the first op of any "
         f"worker to the last op of any worker (gradients already in the actors); {rounds} round(s), each: every "
         f"configuration on a fresh RayEngine, {result['iters']} syncs after {WARMUP_SYNCS} warm-ups, then gloo; "
         f"medians over all "
         f"{rounds * result['iters']} syncs. gloo: all_reduce + divide, {result['workers']} processes on loopback, "
         f"barrier to barrier, {result['iters']} iterations, run before the first round and after every round "
         f"(ratios against the median of all). Simulator: `{result['cluster']}`, profile: {result.get('profile', 'packaged')}.", ""]

    head = ["configuration", "transport", "sync span ms (min–max)", "run_flat wall ms", "Ray calls",
            "× gloo 25 MiB buckets", "× gloo per tensor", "simulator ms", "× simulator", "rel err"]
    body = [[r["config"], r["transport"] or "default",
             f"{ms(r['span_s'])} ({ms(min(r['spans_s']))}–{ms(max(r['spans_s']))})", ms(r["wall_s"]), r["ray_calls"],
             round(r["span_s"] / ref["gloo-bucket"], 2), round(r["span_s"] / ref["gloo-tensor"], 2),
             ms(r["sim"]["span_s"]), round(r["span_s"] / r["sim"]["span_s"], 2),
             f"{r['rel_error']:.1e}" + ("" if r["consistent"] else " INCONSISTENT")] for r in runs]
    for name in GLOO:
        each = " / ".join(str(ms(g[name]["sync_median_s"])) for g in gloo)
        body.append([BASELINES[name], "", f"{ms(ref[name])} (each gloo run: {each})"] + [""] * 7)
    L += ["## Sync span", "", markdown_table(head, body), ""]

    L += ["## Where the span goes", "",
          "Each actor's time in the span cut into categories that add up to the span, averaged over actors: in ms "
          "for the median sync (the column sums to the median span), and in % of the span over all timed syncs "
          "(category totals over span totals: the column sums to 100). How each is attributed: "
          "`benchmarks/ray_breakdown.py` and `docs/performance.md`. Wall time: on this machine the actors wait for "
          "a core during most of it (see the CPU table below).", ""]

    def share(r: dict[str, Any], key: str) -> float:
        return 100 * sum(s["breakdown"]["mean"][key] for s in r["syncs"]) / sum(s["span_s"] for s in r["syncs"])

    head = ["category"] + [f"{r['config']} ms" for r in runs] + [f"{r['config']} % (all syncs)" for r in runs]
    body = [[f"{label} (`{key}`)"] + [ms(median_sync(r)["breakdown"]["mean"][key]) for r in runs]
            + [round(share(r, key), 1) for r in runs] for key, label in rb.CATEGORIES.items()]
    body.append(["**sum = sync span**"] + [ms(sum(median_sync(r)["breakdown"]["mean"].values())) for r in runs]
                + [round(sum(share(r, k) for k in rb.CATEGORIES), 1) for r in runs])
    L += [markdown_table(head, body), ""]

    figures = [per_call_figures(r) for r in runs]
    L += ["## Per Ray call, per sync and against the simulator", "",
          markdown_table(["figure"] + [r["config"] for r in runs],
                         [[k] + [f.get(k, "") for f in figures]
                          for k in dict.fromkeys(k for f in figures for k in f)]), ""]

    L += ["## CPU in the sync span", "",
          "CPU seconds used between the first and the last op, mean over the timed syncs, against the capacity of "
          f"{m['cores']} cores × span: /proc counters sampled every 10 ms (`ray_breakdown.CpuSampler`). The actors' "
          "main threads are where Ray runs their calls (their CPU from schedstat, the ops' own from the timeline); "
          "*outside* is busy time of the machine that none of these processes account for (other users of this "
          "shared machine).", ""]
    cpu = [cpu_rows(r) for r in runs]
    body = [[k] + [ms(c[k]) for c in cpu] for k in (cpu[0] if cpu else {})]
    body.append(["**cores × span**"] + [ms(m["cores"] * statistics.fmean(r["spans_s"])) for r in runs])
    body.append(["Ray's machinery (rows 2–6) / the ops' own CPU"]
                + [round(ray_cpu(r["cpu"]) / r["cpu"]["ops"], 1) for r in runs])
    body.append(["actor main thread waiting for a CPU, % of span"]
                + [round(100 * r["cpu"]["actor thread waiting for CPU"] / r["actors"] / statistics.fmean(r["spans_s"]))
                   for r in runs])
    L += [markdown_table(["CPU ms in the span"] + [r["config"] for r in runs], body), ""]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=5, help="timed syncs per configuration (after WARMUP_SYNCS warm-ups)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--out", default="benchmarks/results/one_machine_breakdown")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--configs", default=",".join(CONFIGS), help="strategy/codec pairs, comma-separated")
    p.add_argument("--transport", default=None, help="RayEngine transport(s), comma-separated (when RayEngine has one)")
    p.add_argument("--profile", default=None,
                   help="the simulator's profile (a casync profile JSON; default: the packaged one). The data-plane "
                        "goal compares with benchmarks/results/profile/profile_before_dataplane.json")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat [every configuration, then gloo] this many times and pool the syncs (a shared "
                        "machine's load moves; rounds spread it over all configurations)")
    args = p.parse_args(argv)
    if args.iters < 1 or args.workers < 2 or args.rounds < 1:
        p.error("--iters and --rounds must be >= 1, --workers >= 2")
    transports = [t.strip() for t in args.transport.split(",")] if args.transport else [None]
    options = {t: engine_options(t) for t in transports}
    words = [os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])
    command = "python " + " ".join(shlex.quote(a) for a in words)
    started = time.time()
    setup = local_setup()
    cluster = setup.cluster_model(args.workers)
    profile = Profile.load(args.profile) if args.profile else None
    configs = [c.strip().split("/", 1) for c in args.configs.split(",") if c.strip()]
    codecs = tuple(codec for _, codec in configs)
    result: dict[str, Any] = {"machine": machine_info(), "command": command, "model": args.model,
                              "workers": args.workers, "iters": args.iters, "rounds": args.rounds,
                              "cluster": repr(cluster), "profile": args.profile or "packaged",
                              "gloo": [], "runs": []}
    import ray

    from casync.runtime.ray_layer import connect_ray

    def gloo() -> None:
        log(f"gloo: {', '.join(GLOO)}, {args.workers} processes")
        result["gloo"].append(run_baselines(setup.launcher(), args.model, args.workers, GLOO, iters=args.iters))

    plans = {f"{strategy}/{codec}": make_plan(args.model, args.workers, strategy, codec, codecs, cluster)
             for strategy, codec in configs}
    runs = {(label, t): {"config": label, "transport": t, "actors": len(plan.actors), "send_bytes": send_bytes(plan),
                         "sim": predicted(plan, cluster, profile), "syncs": [], "consistent": True}
            for t in transports for label, plan in plans.items()}
    exact = exact_mean(args.model, args.workers)
    try:
        gloo()
        for round_ in range(args.rounds):
            connect_ray(None)  # gloo always runs without Ray's processes up
            store = GradientStore(args.model)
            for (label, transport), run in runs.items():
                log(f"round {round_ + 1}/{args.rounds}: RayEngine {label}, transport {transport or 'default'}")
                got = measure_engine(plans[label], store, exact, args.iters, options[transport])
                run["syncs"] += got["syncs"]
                run["consistent"] &= got["consistent"]
                run.setdefault("rel_error", got["rel_error"])
                log(f"  median span {ms(statistics.median(s['span_s'] for s in got['syncs']))} ms "
                    f"(simulator {ms(run['sim']['span_s'])} ms)")
            ray.shutdown()
            gloo()
    finally:
        if ray.is_initialized():
            ray.shutdown()
    for run in runs.values():
        summarize(run)
    result["runs"] = list(runs.values())
    result["numel"] = model_numel(args.model)
    result["seconds"] = time.time() - started
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_vs_gloo.json").write_text(json.dumps(result, indent=1, default=str))  # first: a render bug loses nothing
    text = render(result)
    (out / "ray_vs_gloo.md").write_text(text)
    print(text)
    log(f"wrote {out / 'ray_vs_gloo.md'} and ray_vs_gloo.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
