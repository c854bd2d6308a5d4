"""CPU floor: what the emulated cluster's 2 shared cores hide (issues #14 and #16).

    python benchmarks/cpu_floor.py [--model resnet50] [--workers 4] [--gbps 1,10,25,100]
                                   [--cores-per-node 2,4] [--out benchmarks/results/cpu_floor]

The emulated cluster (``benchmarks/netem``) runs 4 nodes, the Ray head and the baselines on ONE machine with 2
cores, so every compressed configuration measured there sits near the same ~200 ms however few bytes it sends.
This script shows that with the simulator instead of asserting it.  For the netem grid's configurations
(ring, ps two-way, allgather x none, onebit, randomk 1 %; plans built as ``casync bench`` builds them,
``casync.bench.predict.make_plan``) it simulates one sync on

* **(a)** the emulated cluster as it is: ``ClusterModel(nodes=N, workers_per_node=1, bandwidth_gbps=G,
  host_cores=2)``: every node's ops compete for the machine's 2 cores;
* **(b)** the same nodes, each with cores of its own (``cores_per_node=C``, ``host_cores=None``), and with
  ``C:L`` an actor running L ops at once (``compute_lanes=L``: ``RayEngine(compute_threads=L)``);

with the direct plane's calibrated profile (``benchmarks/results/cpu_floor/profile_direct_calibrated_threads.json``: ops
as they ran in loaded Ray actors, and the CPU of the actors' other threads) and with the packaged
micro-benchmark profile (ops at their profiled speed).

The baseline, gloo ``all_reduce`` in 25 MiB buckets (what DDP does), is not a casync plan.  Its stand-in is
casync's uncompressed ring (``ring/none``): gloo's ring algorithm moves the same 2(N-1)/N x bytes per node and
does the same float adds.  The pure link floor, 2(N-1)/N x bytes / bandwidth, is given too: no all-reduce
beats it.  **op CPU** is the compute the plan's ops need per sync over all actors (from the simulated
timeline); **thread CPU** what the data plane's threads take besides (a calibrated direct plane's CPU per sync
and per message; none in the packaged profile); **floor** is what both cost at best on the cores the
setting has: on (a) their sum / host cores, on (b) the busiest node's over its cores, or one actor's op CPU
over its compute lanes where that is larger.  It bounds syncs run back to back; one simulated sync (first op
to last) can end a little below it, as part of the threads' CPU comes after its last op.
Measured times come from the committed netem runs' ``bench.json`` (``benchmarks/results/netem_*``).
PowerSGD is not a casync plan and is not modelled; only its measured times are reported.
"""
from __future__ import annotations

import argparse
import glob
import json
import re
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from casync.bench.grid import codec_label
from casync.bench.predict import make_plan
from casync.plan.tensors import tensor_specs
from casync.sim.costmodel import ClusterModel, Profile
from casync.sim.simulator import simulate
from casync.table import markdown_table

STRATEGIES = ("ring", "ps-twoway", "allgather")
CODECS = ("none", "onebit", "randomk:ratio=0.01")
STANDIN = ("ring", "none")  # casync's stand-in for gloo's bucketed ring all_reduce
CALIBRATED = "benchmarks/results/cpu_floor/profile_direct_calibrated_threads.json"
#: the issues' goals: {Gbit: {issue: x gloo / DDP allreduce the best casync configuration must reach}}
GOALS = {1.0: {"#14 (RayEngine)": 8.0, "#16 (DDP hook)": 4.0}, 10.0: {"#14 (RayEngine)": 2.5, "#16 (DDP hook)": 2.0}}


def op_cpu(timeline) -> dict[str, float]:
    """Seconds of compute per actor in one simulated sync (the ops' own cost, not their wait for a core)."""
    out: dict[str, float] = defaultdict(float)
    for r in timeline.records:
        if "/compute" in r["lane"]:
            out[r["actor"]] += r["end"] - r["start"]
    return dict(out)


def thread_cpu(plan, cluster: ClusterModel, profile: Profile) -> dict[str, float]:
    """Seconds per actor of the data plane's threads in one sync, as the simulator charges them (a calibrated
    direct plane's ``sync_cpu_s``, and ``Profile.message_cpu_shares`` per message; 0 for profiles without
    them)."""
    out: dict[str, float] = defaultdict(float)
    for node in plan.nodes(op="send"):
        a = plan.graph.nodes[node]
        shares = profile.message_cpu_shares(a["nbytes"], cluster.node_of(a["actor"]) == cluster.node_of(a["peer"]))
        for actor, seconds in zip((a["actor"], a["peer"]), shares):
            out[actor] += seconds
    for actor in plan.actors:
        out[actor] += profile.sync_cpu_s
    return dict(out)


def floor_s(per_actor: dict[str, float], cluster: ClusterModel) -> float:
    """The least time the ops' CPU needs on ``cluster``'s cores (shared host cores, or each node's own)."""
    if cluster.host_cores:
        return sum(per_actor.values()) / cluster.host_cores
    nodes: dict[int, list[float]] = defaultdict(list)
    for actor, s in per_actor.items():
        nodes[cluster.node_of(actor)].append(s)
    cores = cluster.cores_per_node or float("inf")
    return max(max(sum(v) / cores, max(v) / cluster.compute_lanes) for v in nodes.values())


def setting_name(cores: int, lanes: int = 1) -> str:
    return f"b{cores}" if lanes == 1 else f"b{cores}x{lanes}"


def settings(workers: int, gbps: float, latency_us: float, host_cores: int,
             cores_per_node: tuple[tuple[int, int], ...]):
    """``{name: ClusterModel}``: (a) the emulated nodes sharing ``host_cores``, (b) each with its own cores
    (``(cores, compute lanes per actor)`` pairs)."""
    common = dict(nodes=workers, workers_per_node=1, bandwidth_gbps=gbps, latency_us=latency_us)
    out = {"a": ClusterModel(**common, host_cores=host_cores)}
    out.update({setting_name(c, l): ClusterModel(**common, cores_per_node=c, compute_lanes=l)
                for c, l in cores_per_node})
    return out


def parse_cores(text: str) -> tuple[tuple[int, int], ...]:
    """``"2,4,4:2"`` -> ``((2, 1), (4, 1), (4, 2))``: cores per node, optionally ``:`` compute lanes per actor."""
    out = []
    for item in text.split(","):
        cores, _, lanes = item.partition(":")
        out.append((int(cores), int(lanes or 1)))
    return tuple(out)


def simulate_grid(model: str, workers: int, rates: tuple[float, ...], profiles: dict[str, Profile],
                  host_cores: int = 2, cores_per_node: tuple[tuple[int, int], ...] = ((2, 1),),
                  latency_us: float = 10.0,
                  configs=None) -> list[dict]:
    """One row per (profile, rate, configuration): wire bytes per node and, per setting, the simulated sync,
    the ops' CPU seconds and the floor; plus the link floor of an all-reduce at that rate."""
    nbytes = sum(s.numel for s in tensor_specs(model)) * 4
    configs = configs or [(s, c) for s in STRATEGIES for c in CODECS]
    rows = []
    for pname, profile in profiles.items():
        for gbps in rates:
            clusters = settings(workers, gbps, latency_us, host_cores, cores_per_node)
            link = 2 * (workers - 1) / workers * nbytes / (gbps * 1e9 / 8)
            for strategy, codec in configs:
                plan = make_plan(model, workers, strategy, codec, (codec,), clusters["a"])
                row = dict(profile=pname, gbps=gbps, strategy=strategy, codec=codec, link_floor_s=link)
                for name, cluster in clusters.items():
                    tl = simulate(plan, cluster, profile)
                    cpu, threads = op_cpu(tl), thread_cpu(plan, cluster, profile)
                    total = {a: cpu.get(a, 0.0) + threads.get(a, 0.0) for a in set(cpu) | set(threads)}
                    # the floor: every core busy with ops and threads, each actor's ops on its own lanes
                    floor = max(floor_s(total, replace(cluster, compute_lanes=10**9)), floor_s(cpu, cluster))
                    row[name] = dict(sync_s=tl.sync_time(), op_cpu_s=sum(cpu.values()),
                                     thread_cpu_s=sum(threads.values()), floor_s=floor, cluster=cluster.to_dict())
                    row["wire_mb_per_node"] = sum(tl.bytes_per_link.values()) / workers / 1e6
                rows.append(row)
    return rows


def measured(results: Path, model: str, workers: int, gbps: float) -> dict[tuple[str, str], list[tuple[str, float]]]:
    """``{(strategy, codec): [(run, sync ms), ...]}`` newest run first, from the committed netem runs on the
    direct plane (``baseline`` rows: ``(name, "")``)."""
    runs = []
    for path in glob.glob(str(results / "netem_*" / "bench.json")):
        data = json.loads(Path(path).read_text())
        setup = data["setup"]
        if setup["nodes"] != workers or setup["bandwidth_gbps"] != gbps or "direct" not in (
                data["grid"].get("transports") or ()):  # older runs predate the direct data plane
            continue
        md = Path(path).with_suffix(".md")
        stamp = re.search(r"Generated (\S+ \S+)", md.read_text()) if md.exists() else None
        runs.append((stamp.group(1) if stamp else "", Path(path).parent.name, data))
    out: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    for _, run, data in sorted(runs, reverse=True):
        for r in data["rows"]:
            if r["model"] == model and r["workers"] == workers and r["system"] in ("casync", "baseline"):
                key = (r["strategy"], r["codec"]) if r["system"] == "casync" else (r["strategy"], "")
                out[key].append((run, r["sync_s"] * 1e3))
    return dict(out)


def _measured_cell(values) -> str:
    if not values:
        return ""
    ms = [v for _, v in values]
    spread = f" ({min(ms):.0f}–{max(ms):.0f}, {len(ms)} runs)" if len(ms) > 1 else ""
    return f"{ms[0]:.0f}{spread} `{values[0][0]}`"


def report(rows: list[dict], meas: dict[float, dict], names: list[str], host_cores: int) -> tuple[str, list]:
    """Markdown: a summary (best configuration against the stand-in, per rate, profile and setting) and the
    tables per profile and rate; also the summary rows for the JSON."""
    summary, details = [], []
    bs = [n for n in names if n != "a"]
    by = defaultdict(list)
    for r in rows:
        by[(r["profile"], r["gbps"])].append(r)
    for (pname, gbps), group in by.items():
        standin = next(r for r in group if (r["strategy"], r["codec"]) == STANDIN)
        link = standin["link_floor_s"]
        table = []
        for r in group:
            key = (r["strategy"], r["codec"])
            cells = [f"{r['strategy']}/{codec_label(r['codec'])}", round(r["wire_mb_per_node"], 2),
                     _measured_cell(meas.get(gbps, {}).get(key)), round(r["a"]["sync_s"] * 1e3, 1),
                     round(r["a"]["op_cpu_s"], 3), round(r["a"].get("thread_cpu_s", 0.0), 3),
                     round(r["a"]["floor_s"] * 1e3, 1),
                     round(standin["a"]["sync_s"] / r["a"]["sync_s"], 2)]
            for b in bs:
                cells += [round(r[b]["sync_s"] * 1e3, 1), round(r[b]["floor_s"] * 1e3, 1),
                          round(standin[b]["sync_s"] / r[b]["sync_s"], 2), round(link / r[b]["sync_s"], 2)]
            table.append(cells)
        gloo = meas.get(gbps, {}).get(("gloo-bucket", ""))
        psgd = meas.get(gbps, {}).get(("ddp-powersgd-r1", ""))
        headers = ["configuration", "wire MB/node", "measured ms (range) `newest run`", "(a) sim ms", "op CPU s",
                   "thread CPU s", f"(a) floor ms = CPU / {host_cores}", "(a) × stand-in"]
        for b in bs:
            headers += [f"({b}) sim ms", f"({b}) floor ms", f"({b}) × stand-in", f"({b}) × link floor"]
        details.append(f"### {pname} profile, {gbps:g} Gbit\n\n" + markdown_table(headers, table) + "\n\n"
                       f"Link floor 2(N-1)/N × bytes / bandwidth: {link * 1e3:.1f} ms. Measured gloo all_reduce "
                       f"25 MiB buckets: {_measured_cell(gloo) or 'no committed run'}"
                       + (f" (the stand-in on (a), {standin['a']['sync_s'] * 1e3:.0f} ms, is "
                          f"{standin['a']['sync_s'] * 1e3 / gloo[0][1]:.2f}× that)" if gloo else "")
                       + "; DDP powerSGD_hook rank 1 "
                       f"(not modelled): {_measured_cell(psgd) or 'no committed run'}.\n")
        for name in names:
            best = min((r for r in group if r["codec"] != "none"), key=lambda r: r[name]["sync_s"])
            s = best[name]["sync_s"]
            summary.append(dict(profile=pname, gbps=gbps, setting=name, standin_ms=standin[name]["sync_s"] * 1e3,
                                link_floor_ms=link * 1e3, best=f"{best['strategy']}/{codec_label(best['codec'])}",
                                best_ms=s * 1e3, best_floor_ms=best[name]["floor_s"] * 1e3,
                                x_standin=standin[name]["sync_s"] / s, x_link=link / s,
                                x_gloo_measured=gloo[0][1] / (s * 1e3) if gloo else None,
                                gloo_measured_ms=gloo[0][1] if gloo else None,
                                goals=GOALS.get(gbps, {})))
    srows = [[s["profile"], f"{s['gbps']:g}", s["setting"], round(s["standin_ms"], 1), round(s["link_floor_ms"], 1),
              s["best"], round(s["best_ms"], 1), round(s["best_floor_ms"], 1), round(s["x_standin"], 2),
              round(s["x_link"], 2), "" if s["x_gloo_measured"] is None else round(s["x_gloo_measured"], 2),
              "; ".join(f"{k} ≥ {v:g}×: {'yes' if s['x_standin'] >= v else 'NO'} (allows ≤ {s['standin_ms'] / v:.0f} ms"
                        + (f"; ≤ {s['gloo_measured_ms'] / v:.0f} ms of measured gloo)" if s["gloo_measured_ms"] else ")")
                        for k, v in s["goals"].items())]
             for s in summary]
    sheaders = ["profile", "Gbit", "setting", "stand-in ring/none ms", "link floor ms", "best compressed",
                "best ms", "its floor ms", "× stand-in", "× link floor", "× measured gloo",
                "goal met against the stand-in (the best time it allows)"]
    return markdown_table(sheaders, srows) + "\n\n" + "\n".join(details), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=4, help="emulated nodes, one worker each")
    parser.add_argument("--gbps", default="1,10,25,100", help="link rates, Gbit/s")
    parser.add_argument("--host-cores", type=int, default=2, help="cores of the machine the nodes share, (a)")
    parser.add_argument("--cores-per-node", default="2,4,2:2,4:2",
                        help="each node's own cores, optionally :compute lanes per actor; one setting (b) each")
    parser.add_argument("--latency-us", type=float, default=10.0,
                        help="one-way link latency (links.env of the committed netem runs: 9-10 us)")
    parser.add_argument("--profile", default=CALIBRATED, help="calibrated profile (also: the packaged one)")
    parser.add_argument("--measured", default="benchmarks/results", help="where the netem_*/bench.json runs are")
    parser.add_argument("--out", default="benchmarks/results/cpu_floor")
    args = parser.parse_args()
    from result_files import write_results  # benchmarks/ is on sys.path when run as a script

    started = time.time()
    rates = tuple(float(g) for g in args.gbps.split(","))
    cores = parse_cores(args.cores_per_node)
    profiles = {"calibrated": Profile.load(args.profile), "packaged": Profile.default()}
    rows = simulate_grid(args.model, args.workers, rates, profiles, args.host_cores, cores, args.latency_us)
    meas = {g: measured(Path(args.measured), args.model, args.workers, g) for g in rates}
    names = ["a"] + [setting_name(c, l) for c, l in cores]
    body, summary = report(rows, meas, names, args.host_cores)
    slower = [(r["profile"], r["gbps"], r["strategy"], r["codec"], b) for r in rows for b in names[1:]
              if r[b]["sync_s"] > r["a"]["sync_s"] * (1 + 1e-9)]
    command = (f"python benchmarks/cpu_floor.py --model {args.model} --workers {args.workers} --gbps {args.gbps} "
               f"--host-cores {args.host_cores} --cores-per-node {args.cores_per_node} --latency-us {args.latency_us:g} "
               f"--profile {args.profile}")
    text = (f"# CPU floor: what {args.host_cores} shared cores hide ({args.model}, {args.workers} nodes)\n\n"
            f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {time.time() - started:.1f} s by\n\n"
            f"```\n{command}\n```\n\n"
            f"Settings: **(a)** `ClusterModel(nodes={args.workers}, workers_per_node=1, bandwidth_gbps=G, "
            f"latency_us={args.latency_us:g}, host_cores={args.host_cores})`, the emulated cluster; "
            + "; ".join(f"**({setting_name(c, l)})** the same with `cores_per_node={c}`, `host_cores=None`"
                        + (f", `compute_lanes={l}` (`RayEngine(compute_threads={l})`)" if l > 1 else "") for c, l in cores)
            + f". Profiles: **calibrated** = `{args.profile}` (direct plane, ops as they ran in loaded Ray actors), "
            "**packaged** = `casync/data/default_profile.json` (ops at micro-benchmark speed, ideal runtime). "
            "Gloo's bucketed all_reduce is stood in for by casync's `ring/none` (the same ring algorithm: "
            "2(N-1)/N × bytes per node, the same float adds); **× stand-in** = stand-in's simulated ms / the row's on "
            "the same setting and profile; **× link floor** = 2(N-1)/N × bytes / bandwidth / the row's ms (a ratio no "
            "all-reduce can make smaller). **op CPU** = seconds of compute of all actors per sync (the same on every "
            "setting); **thread CPU** = seconds the data plane's threads take besides, per sync (a calibrated "
            "direct plane's CPU per sync and message, charged on the cores by the simulator; 0 in the packaged "
            "profile); **floor** = (op + thread CPU) / host cores on (a); on (b) the busiest node's / its cores, "
            "or one actor's op CPU / its compute lanes where that is larger. **measured** = sync ms of the "
            "committed netem runs on the direct plane (`benchmarks/results/<run>/bench.json`, newest first, "
            "range over runs). Every configuration is at least as fast on (b) as on (a): "
            f"{'yes' if not slower else 'NO: ' + str(slower)}. **× measured gloo** divides gloo's time measured on the "
            "shared cores, so on (b) it flatters casync; read (b) against the stand-in and the link floor.\n\n## Best compressed configuration against the "
            "stand-in\n\n" + body)
    md = write_results(args.out, "cpu_floor", text, dict(command=command, rows=rows, summary=summary,
                                                         measured={str(g): {f"{k[0]}/{k[1]}": v for k, v in m.items()}
                                                                   for g, m in meas.items()}))
    print(text)
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
