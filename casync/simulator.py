"""Timeline simulator: the plan's graph timed by the cost model instead of executed.

Discrete-event list scheduling: every compute op occupies one of its actor's compute lanes; a send
occupies the sender's egress and the receiver's ingress for as long as the link needs
(``Profile.link_s``: bytes over the NIC bandwidth between nodes, the object-store copy within one) and its
recv completes after the link's delay (the network's one-way latency, plus the runtime's per-hop latency
when the profile is calibrated on Ray).  Ops start when their inputs are ready and a lane is free; ready
ops go in order of readiness, then bucket priority.  The first op of each fused task (same actor, bucket
and hop round, as the Ray engine fuses them) also pays the profile's per-task cost.
"""
from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping

from .costmodel import ClusterModel, Profile
from .plan import SyncPlan


@dataclass
class Timeline:
    """What a simulated iteration looks like: op records, lanes, iteration time, critical path, link bytes."""

    records: list[dict[str, Any]]
    iteration_time: float
    critical_path: list[str]
    bytes_per_link: dict[tuple[str, str], int]
    lanes: list[str] = field(default_factory=list)

    def busy(self, lane: str) -> float:
        """Seconds a lane (``"worker:0/compute0"``, ``"worker:0/egress"``, ...) is occupied."""
        return sum(r["end"] - r["start"] for r in self.records if r["lane"] == lane)

    def sync_time(self) -> float:
        """From the first op to the last (excludes idle time before the first gradient is ready)."""
        if not self.records:
            return 0.0
        return max(r["end"] for r in self.records) - min(r["start"] for r in self.records)

    def draw(self, path: str, title: str = "") -> str:
        """Gantt chart PNG, one lane per actor (the same drawing as the Ray engine's measured timeline)."""
        from .drawing import draw_gantt

        return draw_gantt(self.records, path, title=title or f"simulated: {self.iteration_time * 1e3:.1f} ms")


def _op_cost(a: Mapping[str, Any], profile: Profile, inputs: int) -> float:
    op = a["op"]
    if op == "encode":
        return profile.encode_s(a["codec"], a["numel"], bool(a.get("ef")))
    if op == "decode":
        return profile.decode_s(a["codec"], a["numel"])
    if op == "merge":
        return profile.merge_s(a["numel"], inputs + (1 if a.get("local_input") else 0))
    return 0.0


def simulate(plan: SyncPlan, cluster: ClusterModel | None = None, profile: Profile | None = None,
             ready_times: Mapping[str, float] | None = None) -> Timeline:
    """Predict one iteration of ``plan`` on ``cluster``.

    ``ready_times`` maps tensor (or bucket) names to the second their gradient is ready in the backward
    pass, so synchronization can overlap computation; a bucket is ready when its last member is.
    """
    if not isinstance(plan, SyncPlan):
        raise TypeError(f"simulate needs a SyncPlan, got {type(plan).__name__}")
    cluster = cluster or ClusterModel(nodes=1, workers_per_node=plan.workers)
    if not isinstance(cluster, ClusterModel):
        raise TypeError(f"cluster must be a casync.ClusterModel, got {type(cluster).__name__}")
    capacity = cluster.nodes * cluster.workers_per_node
    if capacity < plan.workers:
        raise ValueError(f"cluster has room for {capacity} workers (nodes x workers_per_node), plan has {plan.workers}")
    profile = profile or Profile.default()
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a casync.Profile (Profile.load(path) reads a file), got {type(profile).__name__}")
    bucket_ready = _bucket_ready(plan, ready_times)
    graph = plan.graph
    node_of = {actor: cluster.node_of(actor) for actor in plan.actors}
    for actor in {a for _, a in graph.nodes(data="actor")} - node_of.keys():
        node_of[actor] = cluster.node_of(actor)

    indeg = {n: graph.in_degree(n) for n in graph}
    ready: dict[str, float] = {}
    cause: dict[str, str | None] = {}
    heap: list[tuple[float, int, int, str]] = []  # (ready, bucket priority, transfer round, node)
    for n, d in indeg.items():
        if d == 0:
            ready[n] = bucket_ready.get(graph.nodes[n]["tensor"], 0.0)
            cause[n] = None
            heapq.heappush(heap, (ready[n], graph.nodes[n]["priority"], graph.nodes[n].get("round", 0), n))
    lane_free: dict[str, float] = defaultdict(float)
    lane_last: dict[str, str] = {}
    task_seen: set[tuple[str, str, int]] = set()
    rounds: dict[str, int] = {}
    records: list[dict[str, Any]] = []
    end: dict[str, float] = {}
    begin: dict[str, float] = {}
    link_bytes: dict[tuple[str, str], int] = defaultdict(int)
    delay: dict[str, float] = {}  # recv node -> seconds its payload takes to become usable after the link

    def compute_lanes(actor: str) -> list[str]:
        """The actor's least busy compute lane, plus one of its node's shared cores when cores are modelled."""
        lanes = [min((f"{actor}/compute{i}" for i in range(cluster.compute_lanes)), key=lambda lane: lane_free[lane])]
        pool = cluster.core_pool(node_of[actor])
        if pool is not None:
            lanes.append(min((f"{pool[0]}/core{i}" for i in range(pool[1])), key=lambda lane: lane_free[lane]))
        return lanes

    while heap:
        t_ready, _, _, n = heapq.heappop(heap)
        a = graph.nodes[n]
        op, actor = a["op"], a["actor"]
        preds = list(graph.predecessors(n))
        rounds[n] = max((rounds[p] + (graph.nodes[p]["op"] == "send") for p in preds), default=0)
        start, lanes, duration = t_ready, [], 0.0
        wire = 0.0
        if op == "send":
            (recv,) = graph.successors(n)
            peer = a["peer"]
            same = node_of[actor] == node_of[peer]
            wire, delay[recv] = profile.link_s(a["nbytes"], same, cluster)
            duration = profile.store_s(a["nbytes"])
            nic = [f"{actor}/egress", f"{graph.nodes[recv]['actor']}/ingress"]
            if duration > 0:  # the sender's copy into the object store, then the wire
                lanes = compute_lanes(actor)
            elif wire > 0:
                lanes, duration, wire = nic, wire, 0.0
            if not same:
                link_bytes[(actor, peer)] += a["nbytes"]
        elif op in ("encode", "decode", "merge"):
            lanes = compute_lanes(actor)
            duration = _op_cost(a, profile, len(preds))
            key = (actor, a["tensor"], rounds[n])
            if key not in task_seen:
                task_seen.add(key)
                duration += profile.task_cost_s
                dispatch = profile.dispatch_s
                head = cluster.core_pool(0)
                if dispatch and head is not None:  # the driver and raylet's CPU for this task, on the head node
                    core = min((f"{head[0]}/core{i}" for i in range(head[1])), key=lambda l: lane_free[l])
                    lane_free[core] = max(lane_free[core], t_ready) + dispatch
        lane_ready = max((lane_free[lane] for lane in lanes), default=0.0)
        if lane_ready > start:  # waited for a lane: the op that held it is on the critical path
            start = lane_ready
            cause[n] = lane_last.get(max(lanes, key=lambda lane: lane_free[lane]))
        finish = start + duration
        if op == "recv":
            finish += delay.pop(n, 0.0)
        end[n] = finish
        begin[n] = start
        for lane in lanes:
            lane_free[lane] = finish
            lane_last[lane] = n
        if wire > 0:  # the payload crosses the NICs once stored; the recv waits for the wire to finish
            wire_start = max([finish] + [lane_free[lane] for lane in nic])
            for lane in nic:
                lane_free[lane] = wire_start + wire
                lane_last[lane] = n
            delay[recv] += wire_start + wire - finish
            records.append(dict(op="wire", actor=actor, tensor=a["tensor"], part=a["part"], start=wire_start,
                                end=wire_start + wire, nbytes=a["nbytes"], node=n, lane=nic[0]))
        if op != "recv":
            records.append(dict(op=op, actor=actor, tensor=a["tensor"], part=a["part"], start=start, end=finish,
                                nbytes=a["nbytes"], node=n, lane=lanes[0] if lanes else actor))
        else:
            records.append(dict(op="recv", actor=actor, tensor=a["tensor"], part=a["part"],
                                start=begin[preds[0]], end=finish,
                                nbytes=a["nbytes"], node=n, lane=f"{actor}/ingress"))
        for s in graph.successors(n):
            if finish >= ready.get(s, -1.0):
                ready[s] = finish
                cause[s] = n
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (ready[s], graph.nodes[s]["priority"], graph.nodes[s].get("round", 0), s))
    if len(end) != graph.number_of_nodes():
        raise ValueError("plan graph has a cycle; cannot simulate")
    last = max(end, key=end.get) if end else None
    path, node = [], last
    while node is not None:
        path.append(node)
        node = cause.get(node)
    lanes = sorted({r["lane"] for r in records})
    return Timeline(records=sorted(records, key=lambda r: r["start"]), iteration_time=max(end.values(), default=0.0),
                    critical_path=path[::-1], bytes_per_link=dict(link_bytes), lanes=lanes)


def _bucket_ready(plan: SyncPlan, ready_times: Mapping[str, float] | None) -> dict[str, float]:
    if not ready_times:
        return {}
    if not isinstance(ready_times, Mapping):
        raise TypeError("ready_times must be a mapping tensor name -> seconds")
    out = {}
    known = {t.name for t in plan.tensors} | {b.name for b in plan.buckets}
    unknown = set(ready_times) - known
    if unknown:
        raise ValueError(f"ready_times names unknown tensors: {sorted(unknown)[:5]}")
    for name, t in ready_times.items():
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"ready_times[{name!r}] must be a non-negative number of seconds, got {t!r}")
    for b in plan.buckets:
        times = [ready_times[m] for m in b.tensor_names if m in ready_times]
        if b.name in ready_times:
            times.append(ready_times[b.name])
        if times:
            out[b.name] = float(max(times))
    return out
