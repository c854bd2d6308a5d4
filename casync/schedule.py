"""Compile a plan into fused per-actor tasks: the unit the Ray engine submits.

Consecutive primitives of one actor become one task, so an iteration costs a few hundred actor calls
rather than thousands.  A task is keyed by (actor, bucket, round), where a node's *round* counts the
cross-actor hops on the longest path that reaches it.  Every cross edge goes from round r to round r+1,
and same-actor edges never go back, so the fused task graph stays acyclic.  Ray-free, so it is tested
(and reused by the simulator) without starting Ray.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from .plan.syncplan import SyncPlan

# rough per-op costs for ordering submissions only (seconds): a call's overhead plus bytes at memory speed
_CALL_S = 2e-4
_BYTES_PER_S = 2e9


@dataclass
class NodeStep:
    """One primitive inside a fused task: its id, attributes and where its inputs come from."""

    node: str
    attrs: dict[str, Any]
    inputs: list[str]  # predecessor node ids in slot order (in this task, or arriving from another task)


@dataclass
class FusedTask:
    """Consecutive ops of one actor executed as a single remote call."""

    id: int
    actor: str
    tensor: str
    round: int
    priority: int
    steps: list[NodeStep]
    remote_inputs: list[str] = field(default_factory=list)  # send nodes on other actors, in argument order
    local_inputs: list[str] = field(default_factory=list)  # same-actor nodes of earlier tasks (kept in the actor)
    after: list[int] = field(default_factory=list)  # same-actor tasks that must finish first (they feed local_inputs)
    outputs: list[str] = field(default_factory=list)  # send nodes whose payload leaves this task, in return order
    keep: dict[str, int] = field(default_factory=dict)  # node -> how many later same-actor tasks read it
    est_start: float = 0.0

    @property
    def nodes(self) -> list[str]:
        return [s.node for s in self.steps]


@dataclass
class Program:
    """The fused tasks of a plan in submission order, plus who produces what."""

    tasks: list[FusedTask]
    producer: dict[str, tuple[int, int]]  # send node -> (task id, return index)

    def tasks_of(self, actor: str) -> list[FusedTask]:
        return [t for t in self.tasks if t.actor == actor]


def node_rounds(graph: nx.DiGraph) -> dict[str, int]:
    """Cross-actor hops on the longest path into each node."""
    rounds: dict[str, int] = {}
    for node in nx.topological_sort(graph):
        rounds[node] = max((rounds[u] + (graph.nodes[u]["actor"] != graph.nodes[node]["actor"])
                            for u in graph.predecessors(node)), default=0)
    return rounds


def compile_program(plan: SyncPlan) -> Program:
    """Group the plan's nodes into fused tasks and order them for submission."""
    graph = plan.graph
    rounds = node_rounds(graph)
    order = plan.topological_order()
    keyed: dict[tuple[str, str, int], list[str]] = {}
    for node in order:
        a = graph.nodes[node]
        keyed.setdefault((a["actor"], a["tensor"], rounds[node]), []).append(node)
    tasks: list[FusedTask] = []
    task_of: dict[str, int] = {}
    for (actor, tensor, rnd), nodes in keyed.items():
        task = FusedTask(id=len(tasks), actor=actor, tensor=tensor, round=rnd,
                         priority=graph.nodes[nodes[0]]["priority"], steps=[])
        for node in nodes:
            inputs = [u for u, _, _ in sorted(graph.in_edges(node, data="slot"), key=lambda e: e[2])]
            task.steps.append(NodeStep(node, dict(graph.nodes[node]), inputs))
            task_of[node] = task.id
        tasks.append(task)
    producer: dict[str, tuple[int, int]] = {}
    for task in tasks:
        members = set(task.nodes)
        for step in task.steps:
            for u in step.inputs:
                if u in members:
                    continue
                if graph.nodes[u]["actor"] == task.actor:  # an earlier task of this actor: value stays in the actor
                    if u not in task.local_inputs:
                        task.local_inputs.append(u)
                        source = tasks[task_of[u]]
                        source.keep[u] = source.keep.get(u, 0) + 1
                        if source.id not in task.after:
                            task.after.append(source.id)
                elif u not in task.remote_inputs:
                    task.remote_inputs.append(u)
            if step.attrs["op"] == "send":
                task.outputs.append(step.node)
                producer[step.node] = (task.id, len(task.outputs) - 1)
    _estimate_starts(tasks, producer)
    tail = _bottom_levels(tasks, producer)
    # ready first (estimated start), then earlier-ready buckets, then the longer remaining critical path
    tasks.sort(key=lambda t: (t.est_start, t.priority, -tail[t.id], t.actor))
    renumber = {t.id: i for i, t in enumerate(tasks)}
    for t in tasks:
        t.id = renumber[t.id]
        t.after = [renumber[i] for i in t.after]
    producer = {n: (renumber[i], k) for n, (i, k) in producer.items()}
    return Program(tasks=tasks, producer=producer)


def _bottom_levels(tasks: list[FusedTask], producer: dict[str, tuple[int, int]]) -> dict[int, float]:
    """Estimated cost of the longest path from each task to the end of the iteration (its critical path)."""
    children: dict[int, set[int]] = {t.id: set() for t in tasks}
    for t in tasks:
        for u in t.remote_inputs:
            children[producer[u][0]].add(t.id)
        for i in t.after:
            children[i].add(t.id)
    by_id = {t.id: t for t in tasks}
    level: dict[int, float] = {}
    for t in sorted(tasks, key=lambda t: -t.est_start):  # est_start is a topological order
        level[t.id] = _task_cost(t) + max((level[c] for c in children[t.id] if c in level), default=0.0)
    return {i: level.get(i, _task_cost(by_id[i])) for i in by_id}


def _task_cost(task: FusedTask) -> float:
    return _CALL_S + sum(s.attrs["nbytes"] for s in task.steps if s.attrs["op"] not in ("send", "recv")) / _BYTES_PER_S


def _estimate_starts(tasks: list[FusedTask], producer: dict[str, tuple[int, int]]) -> None:
    """List-schedule the tasks (one lane per actor, earlier-ready buckets first) to get a submission order
    in which an actor rarely waits on a task submitted before a ready one."""
    by_id = {t.id: t for t in tasks}
    deps = {t.id: {producer[u][0] for u in t.remote_inputs} | set(t.after) for t in tasks}
    finish: dict[int, float] = {}
    lane_free: dict[str, float] = {}
    pending = set(by_id)
    while pending:
        ready = [by_id[i] for i in pending if deps[i] <= finish.keys()]
        ready.sort(key=lambda t: (max((finish[d] for d in deps[t.id]), default=0.0), t.priority, t.round, t.actor))
        for task in ready:
            start = max([lane_free.get(task.actor, 0.0)] + [finish[d] for d in deps[task.id]])
            task.est_start = start
            finish[task.id] = lane_free[task.actor] = start + _task_cost(task)
            pending.discard(task.id)
