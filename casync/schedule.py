"""The one schedule of a plan: which ops run together as a task, and in which order ready work is taken.

Every interpreter of a plan follows it, so the engines and their model cannot drift:

* **hops** (:func:`hop_rounds`): how many send -> recv edges the longest path into an op crosses;
* **tasks**: the ops of one actor, for one bucket, in one hop, run as one unit of work (one Ray call on
  the object-store runtime; the simulator charges a per-task cost on a task's first op).  Every cross-actor
  edge goes from hop r to hop r+1 and same-actor edges never go back, so the task graph is acyclic;
* **order** (:func:`order_key`): among ready work, earlier-ready first, then the bucket's priority (lower
  first: the order gradients become ready in backward), then the exchange round a strategy tagged (a
  shifted exchange), then the node name.  Tasks are submitted in hop order, ties by the same key.

The simulator reads hops from its op table (``casync.sim.optable``, which calls :func:`hop_rounds`) and
orders its ready ops by :func:`order_key`; :func:`compile_program` gives the Ray runtime its tasks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # only annotations: an actor that runs its ActorShare needs no plan module
    from .plan.syncplan import SyncPlan


def hop_rounds(succ: Sequence[Sequence[int]], is_send: Sequence[bool], npred: Sequence[int]) -> list[int]:
    """Per op (integer ids), the send -> recv edges crossed on the longest path into it."""
    hops = [0] * len(succ)
    indeg = list(npred)
    stack = [n for n in range(len(succ)) if indeg[n] == 0]
    while stack:
        n = stack.pop()
        nxt = hops[n] + (1 if is_send[n] else 0)
        for s in succ[n]:
            if nxt > hops[s]:
                hops[s] = nxt
            indeg[s] -= 1
            if indeg[s] == 0:
                stack.append(s)
    return hops


def order_key(ready: float, priority: int, round: int, rank: int) -> tuple[float, int, int, int]:
    """How ready work is ordered: earlier-ready, then bucket priority, then exchange round, then node name."""
    return (ready, priority, round, rank)


@dataclass
class NodeStep:
    """One primitive inside a task: its id, attributes and where its inputs come from."""

    node: str
    attrs: dict[str, Any]
    inputs: list[str]  # predecessor node ids in slot order (in this task, or arriving from another task)


@dataclass
class FusedTask:
    """The ops of one actor for one bucket in one hop, executed as one unit."""

    id: int
    actor: str
    bucket: str
    round: int  # the hop
    priority: int
    steps: list[NodeStep]
    remote_inputs: list[str] = field(default_factory=list)  # send nodes on other actors, in argument order
    local_inputs: list[str] = field(default_factory=list)  # same-actor nodes of earlier tasks (kept in the actor)
    after: list[int] = field(default_factory=list)  # same-actor tasks that must finish first (they feed local_inputs)
    outputs: list[str] = field(default_factory=list)  # send nodes whose payload leaves this task, in return order
    keep: dict[str, int] = field(default_factory=dict)  # node -> how many later same-actor tasks read it

    @property
    def nodes(self) -> list[str]:
        return [s.node for s in self.steps]


@dataclass
class Program:
    """The tasks of a plan in submission order, plus which task returns each send's payload."""

    tasks: list[FusedTask]
    producer: dict[str, tuple[int, int]]  # send node -> (task id, return index)

    def tasks_of(self, actor: str) -> list[FusedTask]:
        return [t for t in self.tasks if t.actor == actor]


def graph_hops(graph: Any) -> dict[str, int]:
    """:func:`hop_rounds` of a plan graph, by node id."""
    names = list(graph)
    index = {n: i for i, n in enumerate(names)}
    hops = hop_rounds([[index[s] for s in graph._succ[n]] for n in names],
                      [graph.nodes[n]["op"] == "send" for n in names], [len(graph._pred[n]) for n in names])
    return dict(zip(names, hops))


def compile_program(plan: SyncPlan) -> Program:
    """Group the plan's ops into tasks; tasks in hop order, ties by :func:`order_key` of their first op."""
    graph = plan.graph
    hops = graph_hops(graph)
    rank = {n: r for r, n in enumerate(sorted(graph))}
    keyed: dict[tuple[str, str, int], list[str]] = {}
    for node in plan.topological_order():
        a = graph.nodes[node]
        keyed.setdefault((a["actor"], a["bucket"], hops[node]), []).append(node)
    tasks: list[FusedTask] = []
    task_of: dict[str, int] = {}
    first: list[str] = []
    for (actor, bucket, hop), nodes in keyed.items():
        task = FusedTask(id=len(tasks), actor=actor, bucket=bucket, round=hop,
                         priority=graph.nodes[nodes[0]]["priority"], steps=[])
        for node in nodes:
            inputs = [u for u, _, _ in sorted(graph.in_edges(node, data="slot"), key=lambda e: e[2])]
            task.steps.append(NodeStep(node, dict(graph.nodes[node]), inputs))
            task_of[node] = task.id
        tasks.append(task)
        first.append(nodes[0])
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
    order = sorted(range(len(tasks)), key=lambda t: (tasks[t].round, order_key(
        0.0, tasks[t].priority, graph.nodes[first[t]].get("round", 0), rank[first[t]])))
    renumber = {old: new for new, old in enumerate(order)}
    tasks = [tasks[old] for old in order]
    for t in tasks:
        t.id = renumber[t.id]
        t.after = [renumber[i] for i in t.after]
    producer = {n: (renumber[i], k) for n, (i, k) in producer.items()}
    return Program(tasks=tasks, producer=producer)


# -- one actor's share of a plan, for the per-rank executor ------------------------------------------------

def priority_key(priority: int, hop: int, round: int, rank: int) -> tuple[int, int, int, int]:
    """How an executor picks among ops whose inputs are there: the most urgent bucket first (lower
    ``priority``; see ``assemble_plan``), then the earlier hop of its chain, the exchange round, the name."""
    return (priority, hop, round, rank)


@dataclass
class ActorOp:
    """One op of an actor's share: its attributes, producers and consumers (indices into the share)."""

    index: int
    node: str
    attrs: dict[str, Any]
    inputs: list[int]  # producers in slot order (all on this actor: a recv stands for its remote send)
    consumers: list[int]
    key: tuple[int, int, int, int]  # priority_key
    peer: str | None = None  # send: receiver; recv: sender
    transfer: int = -1  # send/recv: the transfer's id, the same on both ends


@dataclass
class ActorShare:
    """What one actor runs of a plan: its ops, the transfers it sends and receives, its local inputs."""

    actor: str
    ops: list[ActorOp]
    sends: list[int]
    recvs: list[int]
    local: dict[str, list[int]]  # bucket -> ops reading this actor's own gradient of that bucket

    @property
    def peers_in(self) -> list[str]:
        """Actors this one receives from (one receiver thread each), sorted."""
        return sorted({self.ops[i].peer for i in self.recvs})


def transfer_ids(graph: Any) -> dict[str, int]:
    """Send node -> transfer id (the same numbering in every process: sorted node names); its recv shares it."""
    return {n: i for i, n in enumerate(sorted(n for n, op in graph.nodes(data="op") if op == "send"))}


def actor_shares(plan: SyncPlan, transfer_base: int = 0) -> dict[str, ActorShare]:
    """Every actor's share of ``plan``, ops numbered in the plan's topological order; transfer ids start at
    ``transfer_base`` (actors that run two plans over one channel keep their ids apart)."""
    graph = plan.graph
    hops = graph_hops(graph)
    rank = {n: r for r, n in enumerate(sorted(graph))}
    tids = {n: transfer_base + i for n, i in transfer_ids(graph).items()}
    shares: dict[str, ActorShare] = {a: ActorShare(a, [], [], [], {}) for a in plan.actors}
    where: dict[str, tuple[str, int]] = {}
    for node in plan.topological_order():
        a = graph.nodes[node]
        share = shares[a["actor"]]
        op = ActorOp(index=len(share.ops), node=node, attrs=dict(a), inputs=[], consumers=[],
                     key=priority_key(a["priority"], hops[node], a.get("round", 0), rank[node]))
        if a["op"] == "send":
            op.peer, op.transfer = a["peer"], tids[node]
            share.sends.append(op.index)
        elif a["op"] == "recv":
            (send,) = graph.predecessors(node)
            op.peer, op.transfer = a["peer"], tids[send]
            share.recvs.append(op.index)
        else:
            for u, _, _ in sorted(graph.in_edges(node, data="slot"), key=lambda e: e[2]):
                actor, index = where[u]
                op.inputs.append(index)
                share.ops[index].consumers.append(op.index)
            if a.get("local_input"):
                share.local.setdefault(a["bucket"], []).append(op.index)
        if a["op"] == "send":
            actor, index = where[next(iter(graph.predecessors(node)))]
            op.inputs.append(index)
            share.ops[index].consumers.append(op.index)
        share.ops.append(op)
        where[node] = (a["actor"], op.index)
    return shares


#: Where the transfer ids of a second plan run over the same channel start (a Trainer's full-precision plan).
SECOND_PLAN_TRANSFERS = 1 << 24


def plan_transfers(plan: SyncPlan, transfer_base: int = 0) -> list[Any]:
    """Every send -> recv pair of ``plan`` with its id (from ``transfer_base``), ends and exact body size."""
    from casync.primitives.wire import layout

    from .transport.shm import Transfer

    ids = {n: transfer_base + i for n, i in transfer_ids(plan.graph).items()}
    out = []
    for send, tid in ids.items():
        a = plan.graph.nodes[send]
        out.append(Transfer(tid, a["actor"], a["peer"], layout(plan.codecs[a["codec"]], a["numel"]).nbytes))
    return out
