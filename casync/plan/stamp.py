"""Build each distinct bucket sub-graph once and stamp copies: how ``assemble_plan`` makes large plans quickly.

A plan's buckets mostly share their structure: BERT-base in 25 MiB buckets has 15 buckets and one option
per bucket, so 15 copies of one sub-graph (28 thousand ops each for co-located PS at 64 workers).  A
:class:`Template` is one bucket expanded by its strategy through the :class:`~strategies.GraphBuilder`
(and linted); :meth:`Template.stamp` writes a copy for another bucket of the same structure straight
into the plan's graph dictionaries: node ids and ``ef_key``\\ s take the bucket's name, ``seed_key`` is
rehashed from the new id, ``priority`` is the bucket's, and partition sizes (``numel``, ``nbytes``) are the
bucket's own, recomputed with the builder's rules (encode ``4n``, merge ``4n`` per input, decode / send /
recv the codec's exact wire size).  A template whose nodes do not follow those rules (a strategy adding
nodes with sizes of its own) is only reused for buckets with the very same partition sizes.  The result is
the graph the builder would have made, node for node and in the same order (tests/plan/test_stamp.py),
at about a fifth of the cost.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import networkx as nx

from primitives.codecs import Codec
from strategies import GraphBuilder, Unit, stable_hash


@dataclass
class Template:
    """One bucket's sub-graph as lists (node order = the builder's), ready to be stamped for other buckets."""

    bucket: str
    partitions: tuple[tuple[int, int], ...]
    suffixes: list[str]          # node ids without the bucket name
    attrs: list[dict[str, Any]]  # the template's node attributes
    succ: list[list[tuple[int, int]]]  # per node: (successor index, slot)
    codecs: dict[str, Codec]
    resizable: bool              # sizes follow the builder's rules: reusable for other partition sizes
    renamable: bool              # ids, ef_keys and seed_keys follow the builder's rules: reusable for other names
    rules: list[tuple[int, Any]]  # per node: (multiplier of 4n, or -1 for the codec's wire size; codec key)
    ef_roles: list[str | None]   # per encode with error feedback: the role part of its ef_key
    built: nx.DiGraph | None = None  # the builder's own graph, until it has been linted (then dropped)

    @classmethod
    def build(cls, expand: Callable[[GraphBuilder, Unit], None], unit: Unit) -> "Template":
        """Expand ``unit`` with ``expand`` (a strategy's ``expand`` or ``expand_compact``) once."""
        builder = GraphBuilder(nx.DiGraph())
        expand(builder, unit)
        g = builder.graph
        names = list(g)
        index = {n: i for i, n in enumerate(names)}
        prefix = unit.bucket
        attrs = [g._node[n] for n in names]
        rules: list[tuple[int, Any]] = []
        roles: list[str | None] = []
        resizable = True
        renamable = all(n.startswith(prefix + "/p") for n in names)
        for n, a in zip(names, attrs):
            rule = _size_rule(builder, a)
            resizable = resizable and rule is not None
            rules.append(rule if rule is not None else (0, None))
            role = None
            if a["op"] == "encode":
                tail = f"/{prefix}/{a['part']}"
                key = a.get("ef_key")
                if key is not None and key.endswith(tail):
                    role = key[: -len(tail)]
                renamable = renamable and a.get("seed_key") == stable_hash(n) and (key is None or role is not None)
            roles.append(role)
        return cls(bucket=prefix, partitions=tuple(unit.partitions), suffixes=[n[len(prefix):] for n in names],
                   attrs=attrs, succ=[[(index[v], d["slot"]) for v, d in g._succ[n].items()] for n in names],
                   codecs=builder.codecs, resizable=resizable, renamable=renamable, rules=rules, ef_roles=roles,
                   built=g)

    def fits(self, name: str, partitions: tuple[tuple[int, int], ...]) -> bool:
        """Whether :meth:`stamp` can make bucket ``name`` with ``partitions`` from this template."""
        return (name == self.bucket or self.renamable) and (tuple(partitions) == self.partitions or self.resizable)

    def sizes(self, partitions: tuple[tuple[int, int], ...]) -> tuple[list[int], list[int]]:
        """Per node, in order: elements and bytes for a bucket with ``partitions`` (a resizable template)."""
        if tuple(partitions) == self.partitions:
            return [a["numel"] for a in self.attrs], [a["nbytes"] for a in self.attrs]
        if not self.resizable:
            raise ValueError(f"the template of bucket {self.bucket!r} cannot be resized")
        numel, nbytes = [], []
        for a, (mult, codec) in zip(self.attrs, self.rules):
            start, stop = partitions[a["part"]]
            n = stop - start
            numel.append(n)
            nbytes.append(4 * n * mult if mult >= 0 else self.codecs[codec].compressed_nbytes(n))
        return numel, nbytes

    def graph(self) -> nx.DiGraph:
        """The template itself as a graph: the builder's (until :meth:`release`), else a stamped copy."""
        if self.built is not None:
            return self.built
        out = Graph()
        self.stamp(out, self.bucket, self.attrs[0]["priority"] if self.attrs else 0, self.partitions)
        return out.graph

    def release(self) -> None:
        """Drop the builder's graph (kept only to lint the template once)."""
        self.built = None

    def stamp(self, out: "Graph", name: str, priority: int, partitions: tuple[tuple[int, int], ...]) -> None:
        """Append this sub-graph for bucket ``name`` (its ``priority`` and ``partitions``) to ``out``."""
        if not self.fits(name, partitions):
            raise ValueError(f"the template of bucket {self.bucket!r} cannot be stamped as {name!r}: rebuild it")
        plan = self._plan()
        names = [name + s for s in self.suffixes]
        nodes, succ, pred = out.nodes, out.succ, out.pred
        before = len(nodes)
        # what changes per node, by (partition, size rule): one small dict merged into each node's attributes
        same = tuple(partitions) == self.partitions
        changes = []
        for part, (mult, codec) in plan.kinds:
            change: dict[str, Any] = {"bucket": name, "priority": priority}
            if not same:
                start, stop = partitions[part]
                n = stop - start
                change["numel"] = n
                change["nbytes"] = 4 * n * mult if mult >= 0 else self.codecs[codec].compressed_nbytes(n)
            changes.append(change)
        kind = plan.kind
        new = [{**a, **changes[k]} for a, k in zip(self.attrs, kind)]
        for i in plan.encodes:
            node, a = names[i], new[i]
            a["seed_key"] = stable_hash(node)
            role = self.ef_roles[i]
            if role is not None:
                a["ef_key"] = f"{role}/{name}/{a['part']}"
        nodes.update(zip(names, new))
        if len(nodes) != before + len(names):
            raise ValueError(f"duplicate plan node ids stamping bucket {name!r}: bucket names must not make one "
                             "bucket's node ids another's")
        data = [{"slot": s} for s in plan.slots]  # one data dict per edge, shared by both directions
        # (most ops have one successor and one predecessor: those take the short form)
        succ.update(zip(names, [{names[j]: data[lo]} if j >= 0 else
                                (dict(zip([names[k] for k in js], data[lo:lo + len(js)])) if js else {})
                                for j, js, lo in zip(plan.succ_one, plan.succ_idx, plan.succ_at)]))
        pred.update(zip(names, [{names[i]: data[e]} if i >= 0 else
                                (dict(zip([names[k] for k in us], [data[x] for x in es])) if us else {})
                                for i, us, e, es in zip(plan.pred_one, plan.pred_idx, plan.pred_first,
                                                        plan.pred_edge)]))

    def _plan(self) -> "_Stamp":
        """What :meth:`stamp` precomputes once per template: size kinds, encodes, edges in index form."""
        cached = self.__dict__.get("_stamp")
        if cached is None:
            kinds: dict[tuple[int, Any], int] = {}
            kind = [kinds.setdefault((a["part"], rule), len(kinds)) for a, rule in zip(self.attrs, self.rules)]
            succ_idx, succ_at, slots = [], [], []
            pred_idx: list[list[int]] = [[] for _ in self.attrs]
            pred_edge: list[list[int]] = [[] for _ in self.attrs]
            for i, edges in enumerate(self.succ):
                succ_at.append(len(slots))
                succ_idx.append([j for j, _ in edges])
                for j, slot in edges:
                    pred_idx[j].append(i)
                    pred_edge[j].append(len(slots))
                    slots.append(slot)
            cached = self.__dict__["_stamp"] = _Stamp(
                kinds=list(kinds), kind=kind, encodes=[i for i, a in enumerate(self.attrs) if a["op"] == "encode"],
                succ_idx=succ_idx, succ_at=succ_at, slots=slots, pred_idx=pred_idx, pred_edge=pred_edge,
                succ_one=[js[0] if len(js) == 1 else -1 for js in succ_idx],
                pred_one=[us[0] if len(us) == 1 else -1 for us in pred_idx],
                pred_first=[es[0] if es else -1 for es in pred_edge])
        return cached


@dataclass
class _Stamp:
    kinds: list[tuple[int, Any]]   # distinct (partition, size rule)
    kind: list[int]                # per node: its index in kinds
    encodes: list[int]
    succ_idx: list[list[int]]      # per node: successor indices, in the builder's order
    succ_at: list[int]             # per node: index of its first out-edge in ``slots``
    slots: list[int]               # per edge
    pred_idx: list[list[int]]      # per node: predecessor indices, in the builder's order
    pred_edge: list[list[int]]     # per node: the edges (indices into ``slots``) from those predecessors
    succ_one: list[int]            # per node: its successor's index if it has exactly one, else -1
    pred_one: list[int]            # per node: its predecessor's index if it has exactly one, else -1
    pred_first: list[int]          # per node: its first in-edge, -1 if none


def _size_rule(builder: GraphBuilder, a: dict[str, Any]) -> tuple[int, Any] | None:
    """How a node's ``nbytes`` follows from its partition's size under the builder's rules: ``(m, None)`` for
    ``4 n m`` (encode, merge of m inputs), ``(-1, codec)`` for the codec's wire size; None otherwise."""
    n, nbytes, op = a["numel"], a["nbytes"], a["op"]
    if n <= 0:
        return None
    if op in ("encode", "merge"):
        return None if nbytes % (4 * n) else (nbytes // (4 * n), None)
    codec = a.get("codec")
    if codec in builder.codecs and nbytes == builder.wire_nbytes(codec, n):
        return (-1, codec)
    return None


class Graph:
    """A plan graph under construction: the dictionaries of a ``networkx.DiGraph`` (node attributes,
    successors, predecessors), written directly — what ``add_node`` / ``add_edge`` would store: one attribute
    dict per node, one data dict per edge shared by both directions."""

    def __init__(self, graph: nx.DiGraph | None = None) -> None:
        self.graph = nx.DiGraph() if graph is None else graph
        if len(self.graph):
            raise ValueError("Graph needs an empty networkx.DiGraph")
        self.nodes: dict[str, dict[str, Any]] = self.graph._node
        self.succ: dict[str, dict[str, dict[str, int]]] = self.graph._succ  # networkx's _adj is this dict too
        self.pred: dict[str, dict[str, dict[str, int]]] = self.graph._pred

    def adopt(self, graph: nx.DiGraph, bucket: str) -> None:
        """Append ``graph`` (a bucket's sub-graph, which the caller gives up) as it is: its node and edge
        dicts become this graph's."""
        before = len(self.nodes)
        self.nodes.update(graph._node)
        if len(self.nodes) != before + len(graph):
            raise ValueError(f"duplicate plan node ids adding bucket {bucket!r}: bucket names must not make one "
                             "bucket's node ids another's")
        self.succ.update(graph._succ)
        self.pred.update(graph._pred)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a plan is made: plans are hundreds of thousands of small acyclic
    dicts, and the collector's passes over them took more than half the time of assembling a large plan."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
