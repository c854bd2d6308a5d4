"""Timeline simulator: the plan's graph timed by the cost model instead of executed.

Discrete-event list scheduling: every compute op occupies one of its actor's compute lanes; a send
occupies the sender's egress and the receiver's ingress for as long as the link needs
(``Profile.link_s``: bytes over the NIC bandwidth between nodes, the object-store copy within one) and its
recv completes after the link's delay (the network's one-way latency, plus the runtime's per-hop latency
when the profile is calibrated on Ray); where the cluster models cores, a calibrated direct plane's threads
also take ``Profile.message_cpu_s`` of a core per message (and ``sync_cpu_s`` per actor), which the ops then
wait for; where buckets become ready one after another (a backward pass producing them), each worker's
backward takes its share of the cores between one bucket's ready time and the next (:func:`backward_slices`).
Ops start when their inputs are ready and a lane is free; ready ops are taken in the order of the one schedule
(``casync.schedule.order_key``: readiness, bucket priority, exchange round, node name), and the first op of each task of that schedule (same actor, bucket and hop) also pays the profile's per-task cost.

The event loop (:func:`run_table`) reads the plan as an :class:`~casync.sim.optable.OpTable` (flat lists of
integers, lanes numbered), about 2 us per op; the planner feeds it tables glued from per-bucket fragments.
"""
from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..plan.ready import bucket_ready_times
from ..plan.syncplan import SyncPlan
from ..schedule import priority_key
from .costmodel import ClusterModel, Profile
from .optable import KINDS, RECV, SEND, OpTable

_READY, _SENT, _FREE, _BACKWARD = 0, 1, 2, 3  # event kinds, in the order simultaneous events are handled


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

    def critical_path_seconds(self) -> dict[str, float]:
        """Seconds of the critical path spent in compute ops (encode/decode/merge) and in transfers (a send's
        copy, its wire time and the link's latency up to its recv), without counting any instant twice: a path
        step is the time from where the path had got to until its op ended or the next step began (an op that
        waited for a lane a send held starts once the send's copy is done, while the send's bytes are still on
        the wire).  The two add up to at most ``iteration_time``; the rest is waiting (gradients not ready)."""
        spans: dict[str, tuple[float, float, str]] = {}
        for r in self.records:
            kind = "transfer" if r["op"] in ("send", "wire", "recv") else "compute" if r["op"] in (
                "encode", "decode", "merge") else "other"
            old = spans.get(r["node"])
            spans[r["node"]] = (r["start"], r["end"], kind) if old is None else (
                min(old[0], r["start"]), max(old[1], r["end"]), kind if old[2] == "other" else old[2])
        path = [spans[n] for n in self.critical_path if n in spans]
        out = {"compute": 0.0, "transfer": 0.0}
        reached = 0.0
        for i, (start, end, kind) in enumerate(path):
            if i + 1 < len(path):
                end = min(end, max(path[i + 1][0], start))
            begin = max(start, reached)
            if end > begin and kind in out:
                out[kind] += end - begin
            reached = max(reached, end)
        return out

    def draw(self, path: str, title: str = "") -> str:
        """Gantt chart PNG, one lane per actor (the same drawing as the Ray engine's measured timeline)."""
        from ..drawing import draw_gantt

        return draw_gantt(self.records, path, title=title or f"simulated: {self.iteration_time * 1e3:.1f} ms")


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
    if plan.compact and cluster.asymmetry(plan.workers):
        raise ValueError(f"a compact template simulates one worker for all {plan.workers}, but on this cluster "
                         f"they are not interchangeable ({cluster.asymmetry(plan.workers)}); simulate the full plan")
    profile = profile or Profile.default()
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a casync.Profile (Profile.load(path) reads a file), got {type(profile).__name__}")
    groups = [(b.name, [m.spec for m in b.members]) for b in plan.buckets]
    bucket_ready = dict(zip((b.name for b in plan.buckets), bucket_ready_times(groups, ready_times, plan.tensors)))
    return run_table(OpTable.from_graph(plan.graph), cluster, profile, bucket_ready)


def backward_slices(ready: list[float], profile: Profile, actors: list[str], pool_of: list[list[int] | None]
                    ) -> list[tuple[float, list[tuple[list[int], float]]]]:
    """When and how much CPU the workers' backward passes take off their nodes' cores while a sync overlaps them:
    from each bucket's ready time to the next one's (from the first to the last), each worker whose node's cores
    are modelled takes :meth:`Profile.backward_share` of them per second.  Returns ``[(start, [(pool lanes,
    seconds) per worker])]``; empty where nothing is charged (all buckets ready together, an uncalibrated profile,
    no cores modelled)."""
    times = sorted(set(ready))
    if profile.backward_cores <= 0 or len(times) < 2:
        return []
    workers: dict[int, list[int]] = {}  # pool id -> the worker actors on it
    for a, name in enumerate(actors):
        if name.startswith("worker:") and pool_of[a] is not None:
            workers.setdefault(id(pool_of[a]), []).append(a)
    share = {key: profile.backward_share(len(pool_of[members[0]]), len(members)) for key, members in workers.items()}
    return [(start, [(pool_of[a], share[key] * (end - start)) for key, members in workers.items() for a in members])
            for start, end in zip(times, times[1:])] if workers else []


def run_table(table: OpTable, cluster: ClusterModel, profile: Profile, bucket_ready: Mapping[str, float],
              records: bool = True) -> Timeline:
    """The event loop over an :class:`OpTable`; ``records=False`` (the planner's) keeps only the
    iteration time, with no op records, lanes or critical path."""
    n_ops, n_actors = len(table), len(table.actors)
    kind, actor_of, bucket_of, priority, round_attr, rank, hop = (table.kind, table.actor, table.bucket,
                                                                   table.priority, table.round, table.rank, table.hop)
    succ, nbytes, charge, peer = table.succ, table.nbytes, table.charge, table.peer
    duration_of = table.durations(profile)
    node_of = [cluster.node_of(a) for a in table.actors]

    # lanes are integers: each actor's compute lanes, egress and ingress, then the shared core pools
    lane_names: list[str] = []
    lanes_of: list[list[int]] = []
    for a in table.actors:
        lanes_of.append(list(range(len(lane_names), len(lane_names) + cluster.compute_lanes)))
        lane_names += [f"{a}/compute{i}" for i in range(cluster.compute_lanes)]
    egress = list(range(len(lane_names), len(lane_names) + n_actors))
    lane_names += [f"{a}/egress" for a in table.actors]
    ingress = list(range(len(lane_names), len(lane_names) + n_actors))
    lane_names += [f"{a}/ingress" for a in table.actors]
    pools: dict[str, list[int]] = {}

    def pool_lanes(node: int) -> list[int] | None:
        pool = cluster.core_pool(node)
        if pool is None:
            return None
        if pool[0] not in pools:
            pools[pool[0]] = list(range(len(lane_names), len(lane_names) + pool[1]))
            lane_names.extend(f"{pool[0]}/core{i}" for i in range(pool[1]))
        return pools[pool[0]]

    pool_of = [pool_lanes(node_of[a]) for a in range(n_actors)]
    head = pool_lanes(0) if profile.dispatch_s else None
    dispatch_cpu, task_cost, op_cost = profile.dispatch_s, profile.task_cost_s, profile.op_cost_s
    sync_cpu, synced = profile.sync_cpu_s, set()
    lane_free = [0.0] * len(lane_names)
    lane_last = [-1] * len(lane_names)

    def least_busy(candidates: list[int]) -> int:
        best = candidates[0]
        for lane in candidates:
            if lane_free[lane] < lane_free[best]:
                best = lane
        return best

    def take_core(pool: list[int], at: float, seconds: float, op: int = -1) -> None:
        """CPU off every lane (the runtime's threads, Ray's dispatch): the pool's least busy core, from ``at``."""
        core = least_busy(pool)
        lane_free[core] = max(lane_free[core], at) + seconds
        if op >= 0:
            lane_last[core] = op

    def compute_lanes(actor: int) -> list[int]:
        """The actor's least busy compute lane, plus one of its node's shared cores when cores are modelled."""
        lanes = [least_busy(lanes_of[actor])]
        pool = pool_of[actor]
        if pool is not None:
            lanes.append(least_busy(pool))
        return lanes

    indeg = list(table.npred)
    ready = [-1.0] * n_ops
    cause = [-1] * n_ops
    end = [0.0] * n_ops
    begin = [0.0] * n_ops
    delay = [0.0] * n_ops  # recv -> seconds its payload takes to become usable after the link
    sender = [-1] * n_ops  # recv -> its send
    lanes_held: list[tuple] = [()] * n_ops
    sent_at = [0.0] * n_ops  # send -> when its payload went on the wire
    last, last_end = -1, -math.inf  # the op that ends last (the first such, in processing order)
    # the one schedule's priority: an actor's free lane takes its most urgent waiting op
    urgency = [0] * n_ops
    keys = list(map(priority_key, priority, hop, round_attr, rank))
    for position, n in enumerate(sorted(range(n_ops), key=keys.__getitem__)):
        urgency[n] = position
    queues: list[list[tuple[int, int]]] = [[] for _ in range(n_actors)]  # per actor: (urgency, op) ready
    events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, op or actor)
    seq = 0
    start_of = [bucket_ready.get(name, 0.0) for name in table.buckets]
    for n in range(n_ops):
        if indeg[n] == 0:
            ready[n] = start_of[bucket_of[n]]
            events.append((ready[n], _READY, n, n))
    slices = backward_slices(start_of, profile, table.actors, pool_of)
    for k, (at, _) in enumerate(slices):
        events.append((at, _BACKWARD, k, k))
    heapq.heapify(events)
    task_seen: set[tuple[int, int, int]] = set()
    link_memo: dict[tuple[int, bool], tuple[float, float]] = {}
    link_bytes: dict[tuple[str, str], int] = defaultdict(int)
    rows: list[dict[str, Any]] = []
    done = 0
    pop, push = heapq.heappop, heapq.heappush
    touched: set[int] = set()

    def finished(n: int, finish: float) -> None:
        """``n`` ends at ``finish``: record it and make its successors ready when all their inputs are."""
        nonlocal last, last_end, done
        done += 1
        end[n] = finish
        if finish > last_end:
            last, last_end = n, finish
        for s in succ[n]:
            if finish >= ready[s]:
                ready[s] = finish
                cause[s] = n
            indeg[s] -= 1
            if indeg[s] == 0:
                push(events, (ready[s], _READY, s, s))

    def row(n: int, op: str, start: float, finish: float, lane: str) -> None:
        rows.append(dict(op=op, actor=table.actors[actor_of[n]], bucket=table.buckets[bucket_of[n]],
                         part=table.part[n], start=start, end=finish, nbytes=nbytes[n], node=table.names[n], lane=lane))

    def dispatch(actor: int, now: float) -> None:
        """Start the actor's most urgent waiting ops on its lanes that are free by ``now``."""
        nonlocal seq
        queue = queues[actor]
        while queue:
            lane = least_busy(lanes_of[actor])
            if lane_free[lane] > now:
                return
            _, n = heapq.heappop(queue)
            lanes = [lane]
            pool = pool_of[actor]
            if sync_cpu and pool is not None and actor not in synced:  # the actor's per-sync CPU, at its first op
                synced.add(actor)
                take_core(pool, ready[n], sync_cpu)
            if pool is not None:
                lanes.append(least_busy(pool))
            start = ready[n]
            for held in lanes:
                if lane_free[held] > start:  # waited for a lane: the op that held it is on the critical path
                    start = lane_free[held]
                    cause[n] = lane_last[held]
            k = kind[n]
            if k == SEND:
                duration = profile.store_s(charge[n])
            else:
                duration = duration_of[n] + op_cost
                key = (actor, bucket_of[n], hop[n])
                if key not in task_seen:
                    task_seen.add(key)
                    duration += task_cost
                    if head is not None:  # the driver and raylet's CPU for this task, on the head node's cores
                        take_core(head, ready[n], dispatch_cpu)
            finish = start + duration
            begin[n] = start
            for held in lanes:
                lane_free[held] = finish
                lane_last[held] = n
            lanes_held[n] = tuple(lanes)
            seq += 1
            push(events, (finish, _FREE, seq, actor))
            if k == SEND:  # NICs are granted in issue order, a shifted exchange round by round across actors
                push(events, (finish, _SENT, (round_attr[n] << 40) + seq, n))
            else:
                if records:
                    row(n, KINDS[k], start, finish, lane_names[lane])
                finished(n, finish)

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, event, _, n = pop(events)
            if event == _FREE:
                touched.add(n)
                continue
            if event == _BACKWARD:  # the workers' backwards take their share of the cores until the next bucket
                for pool, seconds in slices[n][1]:
                    take_core(pool, now, seconds)
                continue
            k = kind[n]
            if event == _READY and k != RECV:
                heapq.heappush(queues[actor_of[n]], (urgency[n], n))
                touched.add(actor_of[n])
                continue
            if event == _READY:  # a recv: its payload arrived
                begin[n] = now
                if records:
                    rows.append(dict(op="recv", actor=table.actors[actor_of[n]], bucket=table.buckets[bucket_of[n]],
                                     part=table.part[n], start=sent_at[sender[n]] if sender[n] >= 0 else now, end=now,
                                     nbytes=nbytes[n], node=table.names[n], lane=f"{table.actors[actor_of[n]]}/ingress"))
                finished(n, now)
                continue
            # a send is done on its actor: the payload crosses the NICs (first come, first served), then waits
            # the link's delay before its recv can use it
            if len(succ[n]) != 1:
                raise ValueError(f"send {table.names[n]!r} must feed exactly one recv, feeds {len(succ[n])}")
            actor, recv = actor_of[n], succ[n][0]
            sender[recv] = n
            dst = peer[n]
            same = node_of[actor] == node_of[dst]
            size = charge[n]  # its bucket's largest partition's bytes (see casync.sim.optable)
            costs = link_memo.get((size, same))
            if costs is None:
                costs = link_memo[(size, same)] = (*profile.link_s(size, same, cluster),
                                                   *profile.message_cpu_shares(size, same))
            wire, delay[recv], sender_cpu, receiver_cpu = costs
            for end_actor, seconds in ((actor, sender_cpu), (actor_of[recv], receiver_cpu)):
                if seconds > 0 and pool_of[end_actor] is not None:  # the data plane's threads at each end
                    take_core(pool_of[end_actor], now, seconds, n)
            if not same:
                link_bytes[(table.actors[actor], table.actors[dst])] += nbytes[n]
            arrive, stored = now, now > begin[n]
            sent_at[n] = now
            if wire > 0:
                nic = (egress[actor], ingress[actor_of[recv]])
                wire_start = max(now, lane_free[nic[0]], lane_free[nic[1]])
                if wire_start > now:  # waited for a NIC: the transfer that held it is on the critical path
                    cause[n] = lane_last[nic[0] if lane_free[nic[0]] >= lane_free[nic[1]] else nic[1]]
                for lane in nic:
                    lane_free[lane] = wire_start + wire
                    lane_last[lane] = n
                arrive = wire_start + wire
                sent_at[n] = wire_start
                if records:  # the sender's copy (if any) on its lane, then the wire on its egress
                    row(n, "wire" if stored else "send", wire_start, arrive, lane_names[nic[0]])
            if records and (stored or wire <= 0):
                row(n, "send", begin[n], now, lane_names[lanes_held[n][0]])
            end[n] = arrive  # the send's part of the critical path ends when the payload is on the far side
            done += 1
            if arrive > last_end:
                last, last_end = n, arrive
            recv_ready = arrive + delay[recv]
            if recv_ready >= ready[recv]:
                ready[recv] = recv_ready
                cause[recv] = n
            indeg[recv] -= 1
            if indeg[recv] == 0:
                push(events, (recv_ready, _READY, recv, recv))
        for actor in (touched if len(touched) == 1 else sorted(touched)):
            dispatch(actor, now)
        touched.clear()
    if done != n_ops:
        raise ValueError("plan graph has a cycle; cannot simulate")
    iteration = max(end, default=0.0)
    if not records:
        return Timeline(records=[], iteration_time=iteration, critical_path=[], bytes_per_link=dict(link_bytes))
    path, node, seen = [], last, set()
    while node >= 0 and node not in seen:  # each step goes to what held it back (a lane or an input)
        seen.add(node)
        path.append(table.names[node])
        node = cause[node]
    lanes_used = sorted({r["lane"] for r in rows})
    return Timeline(records=sorted(rows, key=lambda r: r["start"]), iteration_time=iteration,
                    critical_path=path[::-1], bytes_per_link=dict(link_bytes), lanes=lanes_used)
