"""Fit how the Ray runtime stretches an iteration beyond its ops' own cost, from RayEngine's measured timelines.

Micro-benchmarks (``casync.profile``) time each op alone, warm, best of several runs.  Inside a loaded
``RayEngine`` three more things cost time, and the simulator needs them to predict a measured sync:

* **compute scale** — ops run slower in an actor than alone (cold buffers, payloads read from the object
  store, other actors and Ray's own processes on the same cores): measured op time / profiled op time;
* **task gap** — the idle time between two fused tasks of one actor whose inputs were already there
  (dispatch by the owner, argument resolution), less storing the previous task's returns (the
  simulator charges that copy to the sending actor);
* **hop latency** — from the moment a task produced a payload to the moment the receiving actor's task
  starts, when that actor was idle, less the sender's copy into the object store (which the simulator
  charges to the sender's CPU): ``a + b * bytes`` (the owner learns the return is stored and pushes the
  consumer's task);
* **dispatch CPU** — CPU seconds the driver and Ray's own processes burn per task, taken from the cores
  of the head node (it matters once actors outnumber cores);
* **thread CPU** (direct plane) — what an actor's process burns beyond its compute ops (the sender threads'
  copies, socket reads and writes, thread wake-ups, Ray's own threads), per sync and per message sent: it
  competes with the ops for the node's cores, which the hop latency does not say.

``fit_runtime`` reads those from the records of ``RayEngine.timeline()`` and the engine's fused program;
:class:`casync.sim.costmodel.RuntimeCosts` carries them in a :class:`~casync.sim.costmodel.Profile`.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from casync.primitives.ir import COMPUTE_OPS

from ..engines.memory import WARMUP_SYNCS
from ..plan.syncplan import SyncPlan
from ..schedule import Program, compile_program
from ..sim.costmodel import ClusterModel, LinearCost, Profile, RuntimeCosts, scale_key
from ..sim.optable import KINDS, cost_key, folded_merge, handed_decodes, op_seconds
from .backward import measure_backward_cores
from .thread_cpu import fit_thread_cpu


@dataclass
class TaskSpan:
    """One fused task as it ran: when, on which actor, and when the tasks producing its remote inputs ended."""

    actor: str
    start: float
    end: float
    input_ready: float | None  # latest end of the tasks sending it payloads from other actors (None: none)
    input_bytes: int
    output_bytes: int  # payloads it returns: stored in the object store after its last op
    input_actor: str | None = None  # the actor whose task ended at input_ready


def task_spans(program: Program, rows: Sequence[dict[str, Any]]) -> list[TaskSpan]:
    """Reassemble fused tasks from one step's per-op records (``RayEngine.timeline(step)``).

    A payload leaves its producer when the producer's whole task returns (Ray stores return values then),
    so an input is ready at the end of the producing task, not of its send op.
    """
    by_node = {r["node"]: r for r in rows if r.get("node")}
    bounds: dict[int, tuple[float, float]] = {}
    for task in program.tasks:
        recs = [by_node[n] for n in task.nodes if n in by_node]
        if recs:  # a recv record starts at its payload's send; the task itself reached it at the record's end
            bounds[task.id] = (min(r["end"] if r["op"] == "recv" else r["start"] for r in recs),
                               max(r["end"] for r in recs))
    spans = []
    actor_of = {task.id: task.actor for task in program.tasks}
    for task in program.tasks:
        if task.id not in bounds:
            continue
        producers = [program.producer[u][0] for u in task.remote_inputs]
        ready = [(bounds[t][1], actor_of[t]) for t in producers if t in bounds]
        nbytes = sum(by_node[u]["nbytes"] for u in task.remote_inputs if u in by_node)
        out_bytes = sum(by_node[u]["nbytes"] for u in task.outputs if u in by_node)
        last = max(ready) if ready else (None, None)
        spans.append(TaskSpan(task.actor, *bounds[task.id], last[0], nbytes, out_bytes, last[1]))
    return spans


def _predicted_op_s(graph: Any, node: Any, profile: Profile, handed: dict[Any, str]) -> float:
    """An op's profiled seconds, priced as the simulator prices it (``casync.sim.optable.cost_key``)."""
    attrs = graph.nodes[node]
    key = cost_key(graph, node, attrs, attrs["numel"], handed)
    return op_seconds(profile, KINDS.index(attrs["op"]), key, runtime=False)


def _add_op_time(totals: dict[str, list[float]], row: dict[str, Any], graph: Any, profile: Profile,
                 handed: dict[Any, str]) -> None:
    """Add a compute op's measured seconds (its CPU where recorded, else its wall) and its profiled seconds to
    the totals of its kind (``merge``, or ``<op>:<codec name>``; a decode handed to its merge, whose work the
    executor does in the merge, and that merge: ``merge:<codec name>``).  A merge its encode computes
    (``casync.sim.optable.folded_merge``) counts with that encode, whose record carries its work."""
    attrs = graph.nodes[row["node"]]
    if row["op"] == "decode":  # one handed to its merge is done in the merge: counted with the merge's kind
        key = scale_key("merge" if row["node"] in handed else "decode", attrs["codec"])
    elif row["op"] != "merge":
        key = scale_key(row["op"], attrs["codec"])
    elif folded_merge(graph, row["node"], attrs):
        key = scale_key("encode", graph.nodes[next(iter(graph.successors(row["node"])))]["codec"])
    else:  # by the codec whose decodes it adds itself, as the simulator looks it up
        key = scale_key("merge", cost_key(graph, row["node"], attrs, attrs["numel"], handed)[0] or "")
    total = totals.setdefault(key, [0.0, 0.0])
    total[0] += row["cpu"] if row.get("cpu") is not None else row["end"] - row["start"]
    total[1] += _predicted_op_s(graph, row["node"], profile, handed)


def fit_runtime(runs: Iterable[tuple[SyncPlan, Sequence[Sequence[dict[str, Any]]]]], profile: Profile,
                max_actors_per_core: float = 1.0, cores: int | None = None, dispatch_s: float = 0.0,
                cluster: ClusterModel | None = None) -> RuntimeCosts:
    """Fit :class:`RuntimeCosts` from measured runs: ``(plan, [rows of step 1, rows of step 2, ...])``.

    Compute scale is the ops' CPU time (the ``cpu`` of each record: the actor thread's own work, never
    time-sliced with another actor) over their profiled time; records without ``cpu`` count by wall time,
    and only from runs with at most ``max_actors_per_core`` actors per core (``cores``: this machine's).
    Gaps and hops are wall time, so they too come only from those runs.  Sharing cores between actors is
    the simulator's to model (``ClusterModel.cores_per_node``).

    ``cluster``: where the runs' actors were (``ClusterModel.node_of``; default: all on one node).  Hops
    between nodes fit ``remote_hop``, less the link's own time (bytes over its bandwidth plus its latency),
    which the simulator charges separately.
    """
    totals: dict[str, list[float]] = {}  # scale key -> [measured s, profiled s]
    gaps: list[float] = []
    hops: list[tuple[int, float]] = []
    remote: list[tuple[int, float]] = []

    def hop_sample(span: TaskSpan) -> None:
        delay = span.start - span.input_ready - span.input_bytes / profile.transfer_beta_bps  # less the sender's copy
        if cluster is not None and span.input_actor is not None and \
                cluster.node_of(span.input_actor) != cluster.node_of(span.actor):
            remote.append((span.input_bytes, delay - span.input_bytes / cluster.bytes_per_s - cluster.latency_us * 1e-6))
        else:
            hops.append((span.input_bytes, delay))

    for plan, steps in runs:
        graph = plan.graph
        handed = handed_decodes(graph)
        program = compile_program(plan)
        # time-sliced actors: wall times include waiting for a core
        sliced = cores is not None and len(plan.actors) > max_actors_per_core * cores
        for rows in steps:
            for r in rows:
                if r["op"] in COMPUTE_OPS and r.get("node") in graph and (r.get("cpu") is not None or not sliced):
                    _add_op_time(totals, r, graph, profile, handed)
            if sliced:
                continue
            by_actor: dict[str, list[TaskSpan]] = {}
            for span in task_spans(program, rows):
                by_actor.setdefault(span.actor, []).append(span)
            for spans in by_actor.values():
                spans.sort(key=lambda s: s.start)
                first = spans[0] if spans else None
                if first is not None and first.input_ready is not None and first.start > first.input_ready:
                    hop_sample(first)  # the actor's first task waited only for its payload
                for prev, cur in zip(spans, spans[1:]):
                    if cur.input_ready is None or cur.input_ready < prev.start:  # inputs there well before: a pure gap
                        # less storing prev's returns, which the simulator charges to the sender as its copy
                        gaps.append(cur.start - prev.end - prev.output_bytes / profile.transfer_beta_bps)
                    elif cur.input_ready > prev.end:  # the actor sat idle waiting for this payload
                        hop_sample(cur)
    measured_s = sum(m for m, _ in totals.values())
    predicted_s = sum(p for _, p in totals.values())
    if predicted_s <= 0 or not gaps:
        raise ValueError(f"not enough measured data to fit the runtime (runs with at most {max_actors_per_core} "
                         f"actors per core): {len(gaps)} task gaps, {len(hops) + len(remote)} hops, {predicted_s:.3g}s of "
                         "profiled compute")
    gap = max(0.0, statistics.median(gaps))
    # one hop fits a constant latency (_fit_hop); with none (every payload arrived while its consumer was
    # still busy, e.g. slow codecs) a hop costs what starting any task costs: the gap
    hop = _fit_hop(hops) if hops else LinearCost(gap, 0.0)
    # a per-op scale only where the profiled time is large enough to be a ratio, not noise over nothing
    op_scale = {k: max(1.0, m / p) for k, (m, p) in totals.items() if p >= 0.02 * predicted_s and p > 1e-3}
    return RuntimeCosts(compute_scale=max(1.0, measured_s / predicted_s), task_gap_s=gap,
                        hop=hop, op_scale=op_scale, dispatch_s=dispatch_s,
                        samples={"gaps": len(gaps), "hops": len(hops), "remote_hops": len(remote), "ops": len(totals)},
                        remote_hop=_fit_remote_hop(remote, cluster) if remote else None)


def fit_direct_runtime(runs: Iterable[tuple[SyncPlan, Sequence[Sequence[dict[str, Any]]]]], profile: Profile,
                       cluster: ClusterModel | None = None,
                       process_cpu: Sequence[Mapping[str, float]] | None = None, transport: str = "direct",
                       backward_cores: float = 0.0) -> RuntimeCosts:
    """Fit :class:`RuntimeCosts` of the direct data plane (per-rank executors) from measured runs.

    Compute scale as :func:`fit_runtime`.  ``op_gap_s``: the median idle time between two compute ops of
    one actor when the second one's inputs were already there (the executor's own cost per op).  ``hop``:
    from a send being issued to its receiver noticing the payload (the sender thread's copy, the header's
    trip, the receiver thread's wake-up), ``a + b * bytes``; between nodes, beyond the link, ``remote_hop``.
    ``process_cpu`` (one mapping per run, as :attr:`MeasuredRun.process_cpu_s`): each actor's process CPU
    seconds per sync; with it, ``sync_cpu_s``, ``message_cpu_s`` and ``copy_cpu`` are fitted by
    :func:`fit_thread_cpu`.  ``transport``: RayEngine's data plane the runs used; ``backward_cores``: as measured
    by :func:`measure_backward_cores` (stored with the rest; 0: not measured).
    """
    runs = list(runs)
    totals: dict[str, list[float]] = {}
    gaps: list[float] = []
    hops: list[tuple[int, float]] = []
    remote: list[tuple[int, float]] = []
    for plan, steps in runs:
        graph = plan.graph
        handed = handed_decodes(graph)
        for rows in steps:
            done = {r["node"]: r["end"] for r in rows if r.get("node")}
            by_actor: dict[str, list[dict[str, Any]]] = {}
            for r in rows:
                if r["op"] in COMPUTE_OPS and r.get("node") in graph:
                    _add_op_time(totals, r, graph, profile, handed)
                    by_actor.setdefault(r["actor"], []).append(r)
                elif r["op"] == "recv" and r.get("node") in graph:  # op_rows starts a recv when its send was issued
                    sender = graph.nodes[next(iter(graph.predecessors(r["node"])))]["actor"]
                    sample = (r["nbytes"], r["end"] - r["start"])
                    if cluster is not None and cluster.node_of(sender) != cluster.node_of(r["actor"]):
                        remote.append((sample[0], sample[1] - sample[0] / cluster.bytes_per_s
                                       - cluster.latency_us * 1e-6))
                    else:
                        hops.append(sample)
            for ops in by_actor.values():
                ops.sort(key=lambda r: r["start"])
                for prev, cur in zip(ops, ops[1:]):
                    ready = max((done.get(u, 0.0) for u in graph.predecessors(cur["node"])), default=0.0)
                    if ready <= prev["end"]:  # its inputs were there: the time between is the executor's own
                        gaps.append(cur["start"] - prev["end"])
    measured_s = sum(m for m, _ in totals.values())
    predicted_s = sum(p for _, p in totals.values())
    if predicted_s <= 0 or not gaps or not hops:
        raise ValueError(f"not enough measured data to fit the direct runtime: {len(gaps)} op gaps, {len(hops)} "
                         f"hops, {predicted_s:.3g}s of profiled compute")
    op_scale = {k: max(1.0, m / p) for k, (m, p) in totals.items() if p >= 0.02 * predicted_s and p > 1e-3}
    op_gap = max(0.0, statistics.median(gaps))
    sync_cpu, message, copy = (0.0, 0.0, {}) if process_cpu is None else fit_thread_cpu(
        runs, process_cpu, op_gap, cluster, transport)
    return RuntimeCosts(compute_scale=max(1.0, measured_s / predicted_s), task_gap_s=0.0, hop=_fit_hop(hops),
                        op_scale=op_scale, samples={"gaps": len(gaps), "hops": len(hops), "remote_hops": len(remote),
                                                    "ops": len(totals)},
                        remote_hop=_fit_remote_hop(remote, cluster) if remote else None,
                        op_gap_s=op_gap, plane="direct", message_cpu_s=message, copy_cpu=copy, sync_cpu_s=sync_cpu,
                        transport=transport, backward_cores=backward_cores)


#: Remote hops whose payload needs at most this long on the link fit the constant between-node latency:
#: larger payloads share the link with others in flight, and that queueing is the simulator's to model.
REMOTE_FIT_MAX_WIRE_S = 0.01


def _fit_remote_hop(remote: list[tuple[int, float]], cluster: ClusterModel) -> LinearCost:
    """A constant: the median delay beyond the link of the payloads small enough not to queue on it."""
    small = [d for b, d in remote if b / cluster.bytes_per_s <= REMOTE_FIT_MAX_WIRE_S] or [d for _, d in remote]
    return LinearCost(max(0.0, float(np.median(small))), 0.0)


def _fit_hop(hops: list[tuple[int, float]]) -> LinearCost:
    """Median delay per size decade, then a least-squares line through those medians (robust to stragglers)."""
    sizes = np.array([b for b, _ in hops], float)
    delays = np.array([d for _, d in hops], float)
    bins = np.floor(np.log10(np.maximum(sizes, 1.0)) * 2) / 2  # half-decade bins
    xs, ys = [], []
    for b in np.unique(bins):
        sel = bins == b
        xs.append(float(np.median(sizes[sel])))
        ys.append(float(np.median(delays[sel])))
    if len(xs) == 1:
        return LinearCost(max(0.0, ys[0]), 0.0)
    b, a = np.polyfit(xs, ys, 1)
    if a < 0:
        a, b = 0.0, max(0.0, float(np.dot(xs, ys) / np.dot(xs, xs)))
    return LinearCost(float(a), max(0.0, float(b)))


#: (strategy, codec) pairs the default calibration runs: every op kind, small and large payloads.
CALIBRATION_CONFIGS = (("ring", "none"), ("ring", "onebit"), ("allgather", "topk:ratio=0.01"), ("ps", "fp16"),
                       ("ring", "terngrad"), ("ps", "onebit"), ("allgather", "randomk:ratio=0.01"))


def calibration_tensors(count: int = 40, smallest: int = 20_000, largest: int = 3_000_000) -> list[tuple[str, tuple[int]]]:
    """Synthetic gradients for calibration, log-spaced sizes: not any model that validation is run on."""
    sizes = np.unique(np.round(np.geomspace(smallest, largest, count)).astype(int))
    return [(f"t{i}", (int(n),)) for i, n in enumerate(sizes)]


def calibration_plans(workers: int = 2, configs: Iterable[tuple[str, str]] = CALIBRATION_CONFIGS,
                      tensors: list[tuple[str, tuple[int]]] | None = None) -> list[SyncPlan]:
    """The default calibration plans: ``configs`` over ``tensors`` (default: :func:`calibration_tensors`) at
    ``workers`` workers (at most the machine's cores, so op times are not time-sliced between actors)."""
    from ..build import build_plan

    tensors = calibration_tensors() if tensors is None else tensors
    return [build_plan(tensors, workers=workers, strategy=s, codec=c) for s, c in configs]


@dataclass
class MeasuredRun:
    """Timed syncs of one plan on RayEngine: each step's timeline, and each actor's process CPU seconds per
    sync (all its threads: ops, the data plane's, Ray's)."""

    steps: list[list[dict[str, Any]]]
    process_cpu_s: dict[str, float]


def measure_run(plan: SyncPlan, iters: int = 5, timeout_s: float = 300.0, transport: str = "objectstore",
                warmup: int = WARMUP_SYNCS) -> MeasuredRun:
    """Run ``plan`` on a RayEngine (Ray must be up) with random gradients: ``warmup`` untimed steps (default:
    until the actors allocate nothing new, ``casync.engines.memory.WARMUP_SYNCS``), then ``iters`` steps."""
    return measure_runs([plan], iters, timeout_s, transport, warmup)[0]


def measure_runs(plans: Iterable[SyncPlan], iters: int = 5, timeout_s: float = 300.0, transport: str = "objectstore",
                 warmup: int = WARMUP_SYNCS) -> list[MeasuredRun]:
    """:func:`measure_run` of each plan in turn.  On a data plane that re-plans (any but ``objectstore``), a plan
    with as many actors as the one before runs on the same actors (``RayEngine.replan``: a fresh engine's state,
    no actor started), which saves an engine's start-up, seconds, per plan."""
    from .ray_engine import RayEngine

    runs: list[MeasuredRun] = []
    engine = None
    try:
        for plan in plans:
            if engine is not None and (transport == "objectstore" or len(plan.actors) != len(engine.plan.actors)):
                engine.close()
                engine = None
            if engine is None:
                engine = RayEngine(plan, timeout_s=timeout_s, transport=transport)
            else:
                engine.replan(plan)
            runs.append(_timed_syncs(engine, plan, iters, warmup))
    finally:
        if engine is not None:
            engine.close()
    return runs


def _timed_syncs(engine: Any, plan: SyncPlan, iters: int, warmup: int) -> MeasuredRun:
    """``warmup`` untimed syncs of random gradients on ``engine`` (running ``plan``), then ``iters`` timed ones."""
    from ..engines.inputs import flatten_worker_grads, random_grads

    flats, _ = flatten_worker_grads(plan, random_grads(plan))
    for _ in range(warmup):
        engine.run_flat(flats)
    names = list(engine.actors)
    what = "reading the actors' CPU time"
    before = engine.group.get([engine.actors[n].cpu_seconds.remote() for n in names], what)
    steps = []
    for _ in range(iters):
        engine.clear_timeline()
        engine.run_flat(flats)
        steps.append(engine.timeline())
    after = engine.group.get([engine.actors[n].cpu_seconds.remote() for n in names], what)
    per_sync = {n: (b - a) / max(1, iters) for n, a, b in zip(names, before, after)}
    return MeasuredRun(steps, per_sync)


def measure_timelines(plan: SyncPlan, iters: int = 5, timeout_s: float = 300.0,
                      transport: str = "objectstore", warmup: int = WARMUP_SYNCS) -> list[list[dict[str, Any]]]:
    """Each timed step's timeline of :func:`measure_run`."""
    return measure_run(plan, iters, timeout_s, transport, warmup).steps


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 where unavailable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _ray_service_pids(exclude: set[int]) -> list[int]:
    """Processes the driver started for an embedded Ray (raylet, GCS, ...), minus ``exclude`` (the actors)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), []):
            stack.append(child)
            if child not in exclude:
                found.append(child)
    return found


def measure_dispatch(iters: int = 20, tensors: int = 48, workers: int = 2) -> float:
    """CPU seconds the driver and Ray's own processes spend per fused task (Ray must be up, embedded).

    Runs a plan of many tiny unbucketed tensors, so that payloads, loads and results cost next to nothing
    and the driver's and raylet's CPU time is all task dispatch: submission, dependency resolution, replies.
    """
    import ray

    from ..engines.inputs import flatten_worker_grads, random_grads
    from ..build import build_plan
    from .ray_engine import RayEngine

    plan = build_plan([(f"tiny{i}", (256,)) for i in range(tensors)], workers=workers, strategy="ring",
                      codec="onebit", bucket_bytes=1)
    flats, _ = flatten_worker_grads(plan, random_grads(plan))
    with RayEngine(plan, timeout_s=120, transport="objectstore") as engine:
        actors = set(ray.get([a.pid.remote() for a in engine.actors.values()]))
        engine.run_flat(flats)
        services = _ray_service_pids(actors)
        before = time.process_time() + sum(_cpu_seconds(p) for p in services)
        for _ in range(iters):
            engine.run_flat(flats)
        after = time.process_time() + sum(_cpu_seconds(p) for p in services)
        tasks = len(engine.program.tasks) + 2 * len(engine.actors)  # plus a load and a collect per actor
    return max(0.0, (after - before) / (iters * tasks))


def sync_span(rows: Sequence[dict[str, Any]]) -> float:
    """Measured sync time of one step: first op after the gradient load to the last op's end."""
    return max(r["end"] for r in rows) - min(r["start"] for r in rows if r["op"] != "load")


def calibrate_ray(plans: Iterable[SyncPlan] | None = None, profile: Profile | None = None, iters: int = 5,
                  progress: bool = False, address: str | None = None,
                  cluster: ClusterModel | None = None, transport: str = "direct", backward: bool = True) -> Profile:
    """Run each plan (default: :func:`calibration_plans`) on a :class:`casync.RayEngine` (embedded local Ray
    unless one is up, or the cluster at ``address``) over ``transport``, fit the runtime costs and return
    ``profile`` (default: packaged) with them attached.  ``cluster``: where RayEngine's spread placement puts
    the workers, e.g. one per node (then the hops between nodes are fitted as ``remote_hop``).  ``backward``:
    also measure the cores a DDP rank's backward takes (:func:`measure_backward_cores`, a direct plane only)."""
    import ray
    from tqdm.auto import tqdm

    from .ray_layer import connect_ray

    profile = profile or Profile.default()
    plans = calibration_plans() if plans is None else list(plans)
    started = connect_ray(address)
    try:
        measured = list(zip(plans, measure_runs(tqdm(plans, desc="calibrating", disable=not progress), iters,
                                                transport=transport)))
        dispatch = measure_dispatch() if transport == "objectstore" else 0.0
    finally:
        if started:
            ray.shutdown()
    runs = [(plan, m.steps) for plan, m in measured]
    if transport != "objectstore":
        cpu = [m.process_cpu_s for _, m in measured]
        cores = measure_backward_cores() if backward else 0.0
        return profile.with_runtime(fit_direct_runtime(runs, profile, cluster=cluster, process_cpu=cpu,
                                                       transport=transport, backward_cores=cores))
    runtime = fit_runtime(runs, profile, cores=os.cpu_count(), dispatch_s=dispatch, cluster=cluster)
    return profile.with_runtime(runtime)


__all__ = ["CALIBRATION_CONFIGS", "MeasuredRun", "TaskSpan", "calibrate_ray", "calibration_plans",
           "calibration_tensors", "fit_direct_runtime", "fit_runtime", "fit_thread_cpu", "measure_dispatch",
           "measure_run", "measure_runs", "measure_timelines", "sync_span", "task_spans"]
