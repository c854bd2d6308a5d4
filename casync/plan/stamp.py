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

from casync.primitives.codecs import Codec
from casync.strategies import GraphBuilder, Unit, stable_hash


@dataclass
class Template:
    """One bucket's sub-graph as the builder made it (node order = the builder's), stamped for other buckets.

    Building one is only the strategy's expansion: what stamping needs (size rules, renamability, edges in
    index form) is worked out the first time a copy is stamped or resized, so a template that serves one
    bucket only (the common case in a planned plan: one codec for the largest bucket) costs nothing more.
    It shares its node attribute and successor dicts with the graph that adopted the builder's graph: a
    caller keeping templates between calls (the planner) must not edit that graph in between.
    """

    bucket: str
    partitions: tuple[tuple[int, int], ...]
    names: list[str]                  # node ids, in the builder's order
    attrs: list[dict[str, Any]]       # the template's node attributes
    succs: list[dict[str, dict]]      # per node: the builder's successor dict (node id -> edge data)
    codecs: dict[str, Codec]
    built: nx.DiGraph | None = None   # the builder's own graph, until it has been linted (then dropped)

    @classmethod
    def build(cls, expand: Callable[[GraphBuilder, Unit], None], unit: Unit) -> "Template":
        """Expand ``unit`` with ``expand`` (a strategy's ``expand`` or ``expand_compact``) once."""
        builder = GraphBuilder(nx.DiGraph())
        expand(builder, unit)
        g = builder.graph
        return cls(bucket=unit.bucket, partitions=tuple(unit.partitions), names=list(g._node),
                   attrs=list(g._node.values()), succs=list(g._succ.values()), codecs=builder.codecs, built=g)

    @property
    def resizable(self) -> bool:
        """Sizes follow the builder's rules: reusable for other partition sizes."""
        return self._shape().resizable

    @property
    def renamable(self) -> bool:
        """Ids, ef_keys and seed_keys follow the builder's rules: reusable for other bucket names."""
        return self._shape().renamable

    def fits(self, name: str, partitions: tuple[tuple[int, int], ...]) -> bool:
        """Whether :meth:`stamp` can make bucket ``name`` with ``partitions`` from this template."""
        same_parts = tuple(partitions) == self.partitions
        if name == self.bucket and same_parts:
            return True
        shape = self._shape()
        return (name == self.bucket or shape.renamable) and (same_parts or shape.resizable)

    def sizes(self, partitions: tuple[tuple[int, int], ...]) -> tuple[list[int], list[int]]:
        """Per node, in order: elements and bytes for a bucket with ``partitions`` (a resizable template)."""
        if tuple(partitions) == self.partitions:
            return [a["numel"] for a in self.attrs], [a["nbytes"] for a in self.attrs]
        shape = self._shape()
        if not shape.resizable:
            raise ValueError(f"the template of bucket {self.bucket!r} cannot be resized")
        numel, nbytes = [], []
        for a, (mult, codec) in zip(self.attrs, shape.rules):
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
        names = list(map(name.__add__, plan.suffixes))
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
        new = [{**a, **c} for a, c in zip(self.attrs, map(changes.__getitem__, plan.kind))]
        for i, role in zip(plan.encodes, plan.ef_roles):
            a = new[i]
            a["seed_key"] = stable_hash(names[i])
            if role is not None:
                a["ef_key"] = f"{role}/{name}/{a['part']}"
        nodes.update(zip(names, new))
        if len(nodes) != before + len(names):
            raise ValueError(f"duplicate plan node ids stamping bucket {name!r}: bucket names must not make one "
                             "bucket's node ids another's")
        data = [{"slot": s} for s in plan.slots]  # one data dict per edge, shared by both directions
        succ.update(zip(names, _adjacency(names, data, plan.succ_first, plan.succ_at, plan.succ_zero,
                                          plan.succ_many)))
        pred.update(zip(names, _adjacency(names, data, plan.pred_first, plan.pred_at, plan.pred_zero,
                                          plan.pred_many)))

    def _shape(self) -> "_Shape":
        """Whether and how the template follows the builder's rules (worked out once, when first needed)."""
        cached = self.__dict__.get("_shape_cache")
        if cached is None:
            cached = self.__dict__["_shape_cache"] = _Shape.of(self)
        return cached

    def _plan(self) -> "_Stamp":
        """What :meth:`stamp` precomputes once per template: size kinds, encodes, edges in index form."""
        cached = self.__dict__.get("_stamp")
        if cached is None:
            shape = self._shape()
            kinds: dict[tuple[int, Any], int] = {}
            kind = [kinds.setdefault((a["part"], rule), len(kinds)) for a, rule in zip(self.attrs, shape.rules)]
            index = dict(zip(self.names, range(len(self.names))))
            succ_idx = [[index[v] for v in s] for s in self.succs]
            slots = [d["slot"] for s in self.succs for d in s.values()]
            succ_at, pred_idx, pred_edge = [], [[] for _ in self.attrs], [[] for _ in self.attrs]
            e = 0
            for i, js in enumerate(succ_idx):
                succ_at.append(e)
                for j in js:
                    pred_idx[j].append(i)
                    pred_edge[j].append(e)
                    e += 1
            cut = len(self.bucket)
            cached = self.__dict__["_stamp"] = _Stamp(
                suffixes=[n[cut:] for n in self.names], kinds=list(kinds), kind=kind, encodes=shape.encodes,
                ef_roles=shape.ef_roles, slots=slots,
                succ_first=[js[0] if js else 0 for js in succ_idx],
                succ_at=[at if js else 0 for js, at in zip(succ_idx, succ_at)],
                succ_zero=[i for i, js in enumerate(succ_idx) if not js],
                succ_many=[(i, js, list(range(at, at + len(js)))) for i, (js, at) in enumerate(zip(succ_idx, succ_at))
                           if len(js) > 1],
                pred_first=[us[0] if us else 0 for us in pred_idx],
                pred_at=[es[0] if es else 0 for es in pred_edge],
                pred_zero=[i for i, us in enumerate(pred_idx) if not us],
                pred_many=[(i, us, es) for i, (us, es) in enumerate(zip(pred_idx, pred_edge)) if len(us) > 1])
        return cached


@dataclass
class _Shape:
    """How a template's nodes follow the builder's rules (:class:`Template`'s lazily worked-out part)."""

    resizable: bool              # sizes follow the builder's rules: reusable for other partition sizes
    renamable: bool              # ids, ef_keys and seed_keys follow the builder's rules: reusable for other names
    rules: list[tuple[int, Any]]  # per node: (multiplier of 4n, or -1 for the codec's wire size; codec key)
    encodes: list[int]           # the encode nodes' indices
    ef_roles: list[str | None]   # per encode: the role part of its ef_key (None: no error feedback)

    @classmethod
    def of(cls, t: Template) -> "_Shape":
        prefix = t.bucket
        head = prefix + "/p"
        renamable = all(n.startswith(head) for n in t.names)
        memo: dict[tuple, tuple[int, Any] | None] = {}  # few distinct (op, numel, nbytes, codec) per template
        wire: dict[tuple[str, int], int] = {}
        rules: list[tuple[int, Any]] = []
        resizable = True
        for a in t.attrs:
            key = (a["op"], a["numel"], a["nbytes"], a.get("codec"))
            if key in memo:
                rule = memo[key]
            else:
                rule = memo[key] = _size_rule(t.codecs, wire, *key)
            if rule is None:
                resizable = False
                rule = (0, None)
            rules.append(rule)
        encodes = [i for i, a in enumerate(t.attrs) if a["op"] == "encode"]
        roles: list[str | None] = []
        for i in encodes:
            a, n = t.attrs[i], t.names[i]
            role = None
            tail = f"/{prefix}/{a['part']}"
            key = a.get("ef_key")
            if key is not None and key.endswith(tail):
                role = key[: -len(tail)]
            renamable = renamable and a.get("seed_key") == stable_hash(n) and (key is None or role is not None)
            roles.append(role)
        return cls(resizable=resizable, renamable=renamable, rules=rules, encodes=encodes, ef_roles=roles)


@dataclass
class _Stamp:
    """A template in index form, for :meth:`Template.stamp`; a node's successors (and likewise its predecessors)
    are ``first`` and ``at`` (the node and edge, when it has exactly one), or listed in ``zero`` or ``many``."""

    suffixes: list[str]            # node ids without the bucket name
    kinds: list[tuple[int, Any]]   # distinct (partition, size rule)
    kind: list[int]                # per node: its index in kinds
    encodes: list[int]
    ef_roles: list[str | None]     # per encode: the role part of its ef_key
    slots: list[int]               # per edge (edges in the builder's order of their source nodes)
    succ_first: list[int]          # per node: its first successor (0 if none)
    succ_at: list[int]             # per node: the edge to it (an index into ``slots``; 0 if none)
    succ_zero: list[int]           # nodes without successors
    succ_many: list[tuple[int, list[int], list[int]]]  # (node, its successors, the edges to them): several
    pred_first: list[int]          # the same for predecessors, in the order of their edges
    pred_at: list[int]
    pred_zero: list[int]
    pred_many: list[tuple[int, list[int], list[int]]]


def _adjacency(names: list[str], data: list[dict], first: list[int], at: list[int], zero: list[int],
               many: list[tuple[int, list[int], list[int]]]) -> list[dict[str, dict]]:
    """Per node, its neighbour dict (neighbour id -> edge data): most ops have exactly one neighbour each
    way, so every node gets the one-entry form first and the exceptions are patched in."""
    if not data:
        return [{} for _ in names]
    out = [{k: v} for k, v in zip(map(names.__getitem__, first), map(data.__getitem__, at))]
    for i in zero:
        out[i] = {}
    for i, ks, es in many:
        out[i] = dict(zip([names[k] for k in ks], [data[e] for e in es]))
    return out


def _size_rule(codecs: dict[str, Codec], wire: dict[tuple[str, int], int], op: str, n: int, nbytes: int,
               codec: Any) -> tuple[int, Any] | None:
    """How a node's ``nbytes`` follows from its partition's size under the builder's rules: ``(m, None)`` for
    ``4 n m`` (encode, merge of m inputs), ``(-1, codec)`` for the codec's wire size; None otherwise."""
    if n <= 0:
        return None
    if op in ("encode", "merge"):
        return None if nbytes % (4 * n) else (nbytes // (4 * n), None)
    if codec in codecs:
        size = wire.get((codec, n))
        if size is None:
            size = wire[(codec, n)] = codecs[codec].compressed_nbytes(n)
        if nbytes == size:
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
