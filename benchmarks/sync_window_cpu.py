"""Where the CPU goes while RayEngine syncs: the machine, each process and the actors' threads, counted only
inside the sync spans.

    python benchmarks/sync_window_cpu.py [--model resnet50] [--workers 4] [--config ps-twoway/randomk:ratio=0.01]
                                         [--transport direct] [--iters 15] [--netem /run/casync-netem/links.env]
                                         [--out DIR]

On an embedded local Ray (default) or on the emulated cluster (``--netem``, run through ``benchmarks/netem/netem.sh
exec``), the configuration's plan runs as ``casync bench`` runs it (gradients made on each worker's node, 2
warm-ups) while a thread samples, every 20 ms, ``/proc/stat`` (the machine), the CPU of every process that
used any during one more sync (by name: Ray's daemons, the driver and its sampler, the actors) and each actor
Python thread's CPU (named from the actors' own ``threading.enumerate()``; the rest of an actor's process,
Ray's and gloo's native threads, as one row).  Only what falls inside a sync's span (first op to last op, the
actors' clocks) is counted, so the results' fetch to the driver between syncs is left out.
Linux only (``/proc``); all nodes must be on this machine (the emulated cluster is).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import threading
import time

from casync.bench.predict import make_plan
from casync.bench.setup import local_setup, netem_setup
from casync.engines.memory import WARMUP_SYNCS
from casync.table import markdown_table
from result_files import write_results

TICK = os.sysconf("SC_CLK_TCK")
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq")
COMPUTE = ("encode", "decode", "merge")


def process_label(pid: int) -> str | None:
    """A process's name for grouping: Python scripts by file name, others by their command name."""
    try:
        comm = open(f"/proc/{pid}/comm").read().strip()
        argv = open(f"/proc/{pid}/cmdline").read().split("\0")
    except OSError:
        return None
    if comm.startswith("python"):
        script = next((a for a in argv[1:] if a.endswith(".py")), " ".join(argv[1:3]))
        return "python " + os.path.basename(script)
    return comm


def thread_role(name: str) -> str:
    """An actor thread's role from its name, the peers left out (``casync-send-worker:0->worker:1`` -> sender)."""
    return re.sub(r"(worker|server):\d+", "#", name)


def ticks(path: str) -> int:
    try:
        fields = open(path).read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def machine() -> list[int]:
    return [int(x) for x in open("/proc/stat").readline().split()[1:1 + len(STAT_FIELDS)]]


def busy_processes(work) -> dict[int, str]:
    """The processes that used CPU while ``work()`` ran (sampling every process every 10 ms would cost more
    CPU than some of them use), with their labels."""
    every = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    before = {pid: ticks(f"/proc/{pid}/stat") for pid in every}
    work()
    return {pid: label for pid in every if ticks(f"/proc/{pid}/stat") > before[pid]
            and (label := process_label(pid)) is not None}


class Sampler:
    """Every ``period_s``: the machine's CPU counters, and the CPU ticks of the given processes and threads
    (``{tid: pid}``); a few dozen files, so the sampler's own CPU stays small (the driver's row shows it)."""

    def __init__(self, processes: dict[int, str], threads: dict[int, int], period_s: float = 0.02):
        self.processes, self.threads, self.period_s = processes, threads, period_s
        self.samples: list[tuple[float, list[int], dict[int, int], dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="cpu-sampler")

    def _loop(self) -> None:
        while not self._stop.is_set():
            threads = {tid: ticks(f"/proc/{pid}/task/{tid}/stat") for tid, pid in self.threads.items()}
            procs = {pid: ticks(f"/proc/{pid}/stat") for pid in self.processes}
            self.samples.append((time.time(), machine(), procs, threads))
            time.sleep(self.period_s)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def around(self, start: float, end: float):
        """The last sample at or before ``start`` and the first at or after ``end`` (None: not covered)."""
        before = [s for s in self.samples if s[0] <= start]
        after = [s for s in self.samples if s[0] >= end]
        return (before[-1], after[0]) if before and after else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--config", default="ps-twoway/randomk:ratio=0.01", help="strategy/codec")
    p.add_argument("--transport", default="direct", help="RayEngine's data plane (direct, tcp, gloo)")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--netem", default=None, help="links.env of the emulated cluster (run through netem.sh exec)")
    p.add_argument("--out", default=None, help="write sync_window_cpu.md/.json here")
    args = p.parse_args()
    import ray

    from casync.runtime.gradients import GradientStore
    from casync.runtime.ray_engine import RayEngine

    strategy, codec = args.config.split("/", 1)
    setup = netem_setup(args.netem) if args.netem else local_setup()
    plan = make_plan(args.model, args.workers, strategy, codec, (codec,), setup.cluster_model(args.workers))
    started = time.time()
    if not args.netem:
        ray.init(num_cpus=args.workers, include_dashboard=False, object_store_memory=2 * 10**9)
    spans, op_cpu = [], []
    with RayEngine(plan, address=setup.ray_address if args.netem else None, timeout_s=300, placement="spread",
                   transport=args.transport) as engine:
        nodes = engine.actor_nodes()
        flats = GradientStore(args.model).refs(plan, [nodes[f"worker:{w}"] for w in range(plan.workers)])
        for _ in range(WARMUP_SYNCS):
            engine.run_flat(flats)
        names = list(engine.actors)
        actor_pids = ray.get([engine.actors[n].pid.remote() for n in names])
        thread_names: dict[int, str] = {}
        threads: dict[int, int] = {}  # the actors' Python threads: tid -> pid
        for pid, found in zip(actor_pids, ray.get([engine.actors[n].thread_names.remote() for n in names])):
            thread_names.update(found)
            threads.update({tid: pid for tid in found})
        processes = busy_processes(lambda: engine.run_flat(flats))
        processes.update({pid: process_label(pid) or "actor" for pid in actor_pids})
        with Sampler(processes, threads) as sampler:
            for _ in range(args.iters):
                engine.run_flat(flats)
                rows = engine.timeline(engine.step - 1, relative=False)
                spans.append((min(r["start"] for r in rows if r["op"] != "load"), max(r["end"] for r in rows)))
                op_cpu.append(sum(r["cpu"] or 0.0 for r in rows if r["op"] in COMPUTE) / len(names))
    if not args.netem:
        ray.shutdown()
    by_process, by_thread, stat, windows = collections.Counter(), collections.Counter(), [0] * len(STAT_FIELDS), 0
    for start, end in spans:
        pair = sampler.around(start, end)
        if pair is None:
            continue
        (_, m0, p0, t0), (_, m1, p1, t1) = pair
        windows += 1
        stat = [s + b - a for s, a, b in zip(stat, m0, m1)]
        for pid, label in processes.items():
            by_process[label] += p1.get(pid, 0) - p0.get(pid, 0)
        named = 0
        for tid, value in t1.items():
            by_thread[thread_role(thread_names[tid])] += value - t0.get(tid, value)
            named += value - t0.get(tid, value)
        # what the actors' other threads took (Ray's, gloo's): the processes' CPU less their Python threads'
        by_thread["other threads (Ray's, gloo's)"] += sum(p1[pid] - p0[pid] for pid in actor_pids) - named
    if not windows:
        raise SystemExit("no sync span was covered by the samples")

    def ms(value: float, per: int = 1) -> str:
        return f"{value / TICK / windows / per * 1e3:.1f}"

    span_ms = statistics.median(e - s for s, e in spans) * 1e3
    ops_ms = statistics.median(op_cpu) * 1e3
    where = f"the emulated cluster ({args.netem})" if args.netem else "an embedded local Ray"
    command = ("python benchmarks/sync_window_cpu.py " + f"--model {args.model} --workers {args.workers} "
               f"--config {args.config} --transport {args.transport} --iters {args.iters}"
               + (f" --netem {args.netem}" if args.netem else "")
               + (f" --out {args.out}" if args.out else ""))
    if args.netem:
        netem = "benchmarks/netem/netem.sh"
        command = (f"{netem} up --nodes {setup.nodes} --rate {setup.notes.get('rate', '?')}\n{netem} exec {command}\n"
                   f"{netem} down")
    text = (f"# CPU during RayEngine's syncs: {args.model}, {args.workers} workers, {args.config} on "
            f"transport {args.transport}\n\n"
            f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {time.time() - started:.0f} s "
            f"on {where} by\n\n```\n{command}\n```\n\n"
            f"{os.cpu_count()} cores. Median sync span {span_ms:.1f} ms over {len(spans)} syncs after "
            f"{WARMUP_SYNCS} warm-ups; the ops' own CPU (their records' thread time) {ops_ms:.1f} ms per actor and "
            f"sync. CPU is counted only between the samples (every 20 ms) around each span: per sync, ms.\n\n"
            "## The machine\n\n"
            + markdown_table(list(STAT_FIELDS), [[ms(v) for v in stat]])
            + "\n\n## Processes\n\n"
            + markdown_table(["process", "ms per sync"], [[k, ms(v)] for k, v in by_process.most_common() if v])
            + "\n\n## The actors' threads (per actor)\n\n"
            + markdown_table(["thread", "ms per actor and sync"],
                             [[k, ms(v, len(actor_pids))] for k, v in by_thread.most_common() if v])
            + "\n")
    raw = dict(config=args.config, transport=args.transport, model=args.model, workers=args.workers,
               netem=args.netem, spans_s=spans,
               op_cpu_per_actor_s=op_cpu, windows=windows, tick_s=1 / TICK,
               machine={k: v / TICK / windows for k, v in zip(STAT_FIELDS, stat)},
               processes={k: v / TICK / windows for k, v in by_process.items() if v},
               threads_per_actor={k: v / TICK / windows / len(actor_pids) for k, v in by_thread.items() if v})
    print(text)
    if args.out:
        print(write_results(args.out, "sync_window_cpu", text, raw))


if __name__ == "__main__":
    main()
