"""A plan graph as flat lists of integers: what the simulator's event loop reads.

``OpTable.from_graph`` turns a plan's ``networkx`` graph into one row per op (kind, actor, bucket,
priority, bytes, successors, ...), numbered in graph order, so the simulator never looks up node
attributes by name.  ``OpTable.concat`` glues one table per bucket into a whole plan's table: the
planner builds each distinct (bucket size, option) once, as a fragment, and simulates candidate plans
from fragments instead of assembling every candidate's graph.  Both paths give the same rows, in the
same order, as ``from_graph`` on the assembled plan; ties between ops are broken by node name, as
ever, through ``rank``.

**Partitions of a bucket are charged alike.**  ``split_even`` makes a bucket's partitions differ by at
most one element, far below what the cost model resolves; but a cost of ``a + b*n`` that differs by
``b`` between partitions (or a link by four bytes) makes their ready times differ by fractions of a
nanosecond, and the simulator's list scheduling takes ready work earliest first: a shifted all-to-all
exchange (PS pulls, all-gather) would then run host after host instead of round after round, up to
2.7x slower on 64 workers, decided by which partition got the extra element.  So every op is costed as
its bucket's largest partition (``cost`` and ``charge``), while ``nbytes`` keeps the exact bytes that
the timeline reports.  Symmetric exchanges then stay symmetric, and a compact template (one
representative worker, ``Strategy.expand_compact``) simulates exactly as its full plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import networkx as nx

from casync.primitives.codecs import codec_class
from casync.primitives.ir import OPS
from casync.primitives.merge import handed_to_encode, handed_to_merge, merges_in_encode

from ..schedule import hop_rounds

KINDS = OPS  # an op's kind is its index in the IR's op set
ENCODE, SEND, RECV, MERGE, DECODE = (OPS.index(op) for op in ("encode", "send", "recv", "merge", "decode"))
_KIND = {k: i for i, k in enumerate(KINDS)}


@dataclass
class OpTable:
    """One row per op; list ``x[i]`` is op ``i``'s attribute ``x``.  Actors and buckets are indices into
    ``actors`` and ``buckets``; ``rank[i]`` orders ops by node name (the simulator's last tie-break)."""

    names: list[str]
    kind: list[int]
    actor: list[int]
    bucket: list[int]
    part: list[int]
    priority: list[int]
    round: list[int]  # the "round" attribute: the order of a shifted exchange's transfers
    hop: list[int]  # send -> recv edges on the longest path in (``casync.schedule``): with actor and bucket, its task
    nbytes: list[int]  # exact bytes the op reads (compute) or moves (send/recv)
    charge: list[int]  # send: the bytes its link is charged for (its bucket's largest partition); 0 otherwise
    payload: list[Any]  # send: the codec key of its payload (sends of one codec are charged alike); None otherwise
    peer: list[int]  # send: the receiving actor; -1 otherwise
    succ: list[list[int]]
    npred: list[int]
    rank: list[int]
    cost: list[tuple]  # what the op's compute cost depends on (:func:`cost_key`)
    actors: list[str]
    buckets: list[str]  # bucket names; ``bucket[i]`` indexes this
    _durations: dict[int, tuple[Any, list[float]]] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.kind)

    @classmethod
    def from_graph(cls, graph: nx.DiGraph) -> "OpTable":
        """Rows in ``graph``'s node order; ``rank`` sorts node names."""
        index = {n: i for i, n in enumerate(graph)}
        actors: dict[str, int] = {}
        buckets: dict[str, int] = {}
        t = cls(names=list(index), kind=[], actor=[], bucket=[], part=[], priority=[], round=[], hop=[], nbytes=[],
                charge=[], payload=[], peer=[], succ=[], npred=[], rank=[0] * len(index), cost=[], actors=[],
                buckets=[])
        largest: dict[str, int] = {}  # bucket -> elements of its largest partition
        widest: dict[tuple[str, str], int] = {}  # (bucket, codec) -> bytes of its largest send
        for _, a in graph.nodes(data=True):
            b = a["bucket"]
            if a["numel"] > largest.get(b, -1):
                largest[b] = a["numel"]
            if a["op"] == "send" and a["nbytes"] > widest.get((b, a["codec"]), -1):
                widest[(b, a["codec"])] = a["nbytes"]
        pred = graph._pred
        handed = handed_decodes(graph)
        for n, a in graph.nodes(data=True):
            op = a["op"]
            kind = _KIND.get(op)
            if kind is None:
                raise ValueError(f"plan node {n!r} has an unknown op {op!r}; expected one of {', '.join(KINDS)}")
            t.kind.append(kind)
            t.actor.append(actors.setdefault(a["actor"], len(actors)))
            t.bucket.append(buckets.setdefault(a["bucket"], len(buckets)))
            t.part.append(a["part"])
            t.priority.append(a["priority"])
            t.round.append(a.get("round", 0))
            t.nbytes.append(a["nbytes"])
            t.charge.append(widest[(a["bucket"], a["codec"])] if kind == SEND else 0)
            t.payload.append(a["codec"] if kind == SEND else None)
            t.peer.append(actors.setdefault(a["peer"], len(actors)) if kind == SEND else -1)
            t.succ.append([index[s] for s in graph._succ[n]])
            inputs = len(pred[n])
            t.npred.append(inputs)
            t.cost.append(cost_key(graph, n, a, largest[a["bucket"]], handed))
        for r, i in enumerate(sorted(range(len(t.names)), key=t.names.__getitem__)):
            t.rank[i] = r
        t.hop = hop_rounds(t.succ, [k == SEND for k in t.kind], t.npred)
        t.actors = list(actors)
        t.buckets = list(buckets)
        return t

    @classmethod
    def concat(cls, parts: Sequence[tuple["OpTable", str, int]]) -> "OpTable":
        """One table from per-bucket fragments ``(table, bucket name, priority)``, in plan order.

        Each fragment holds one bucket (built under any name); its rows are renumbered after the
        previous fragments', renamed to ``bucket name`` and given ``priority``.  Names compare within a
        bucket exactly as their suffixes do, so ranks stay local when every bucket has its own priority.
        """
        actors: dict[str, int] = {}
        t = cls(names=[], kind=[], actor=[], bucket=[], part=[], priority=[], round=[], hop=[], nbytes=[], charge=[],
                payload=[], peer=[], succ=[], npred=[], rank=[], cost=[], actors=[], buckets=[])
        priorities = [p for _, _, p in parts]
        if len(set(priorities)) != len(priorities):
            raise ValueError("OpTable.concat needs a distinct priority per bucket (ties are broken by name)")
        for b, (frag, name, priority) in enumerate(parts):
            if len(frag.buckets) != 1:
                raise ValueError(f"a fragment holds one bucket, got {len(frag.buckets)}")
            offset = len(t.kind)
            old = frag.buckets[0]
            amap = [actors.setdefault(a, len(actors)) for a in frag.actors]
            t.names += [name + n[len(old):] for n in frag.names]
            t.kind += frag.kind
            t.actor += [amap[a] for a in frag.actor]
            t.bucket += [b] * len(frag)
            t.part += frag.part
            t.priority += [priority] * len(frag)
            t.round += frag.round
            t.hop += frag.hop
            t.nbytes += frag.nbytes
            t.charge += frag.charge
            t.payload += frag.payload
            t.peer += [amap[p] if p >= 0 else -1 for p in frag.peer]
            t.succ += [[s + offset for s in ss] for ss in frag.succ]
            t.npred += frag.npred
            t.rank += [r + offset for r in frag.rank]
            t.cost += frag.cost
            t.buckets.append(name)
        t.actors = list(actors)
        if parts:  # durations the fragments share a profile for carry over
            for key, (profile, _) in parts[0][0]._durations.items():
                if all(frag._durations.get(key, (None,))[0] is profile for frag, _, _ in parts):
                    t._durations[key] = (profile, [d for frag, _, _ in parts for d in frag._durations[key][1]])
        return t

    def resized(self, numel: Sequence[int], nbytes: Sequence[int]) -> "OpTable":
        """This one-bucket table with other partition sizes (``numel`` and ``nbytes`` per op, in row order): the
        same structure, its costs charged as in :meth:`from_graph`."""
        if len(self.buckets) != 1 or len(numel) != len(self) or len(nbytes) != len(self):
            raise ValueError("OpTable.resized needs a one-bucket table and one size per op")
        largest = max(numel, default=0)
        widest: dict[Any, int] = {}
        for k, key, b in zip(self.kind, self.payload, nbytes):
            if k == SEND and b > widest.get(key, -1):
                widest[key] = b
        return replace(self, nbytes=list(nbytes),
                       charge=[widest[key] if k == SEND else 0 for k, key in zip(self.kind, self.payload)],
                       cost=[None if c is None else (c[0], largest, c[2], c[3]) for c in self.cost], _durations={})

    def durations(self, profile: Any) -> list[float]:
        """Seconds of compute per op under ``profile`` (0 for sends and recvs), cached per profile."""
        cached = self._durations.get(id(profile))
        if cached is not None and cached[0] is profile:
            return cached[1]
        memo: dict[tuple, float] = {}
        out = []
        for kind, key in zip(self.kind, self.cost):
            if key is None:
                out.append(0.0)
                continue
            d = memo.get((kind, key))
            if d is None:
                d = memo[(kind, key)] = op_seconds(profile, kind, key)
            out.append(d)
        self._durations[id(profile)] = (profile, out)
        return out


def handed_decodes(graph: nx.DiGraph) -> dict[Any, str]:
    """Decodes the per-rank executor hands to their merge (``casync.primitives.ops.run_node``, by the executor's own
    rule :func:`casync.primitives.merge.handed_to_merge`): ``"entries"`` for a codec with ``decodes_sparse`` (a
    sparsifier's index/value pairs), ``"deferred"`` for one with ``decodes_in_blocks`` (decoded block by block
    as the merge adds)."""
    kinds: dict[str, str | None] = {}
    out = {}
    nodes, succ = graph.nodes, graph._succ
    for n, a in nodes(data=True):
        if a["op"] != "decode":
            continue
        key = a["codec"]
        if key not in kinds:
            cls = codec_class(key)
            kinds[key] = None if cls is None else "entries" if cls.decodes_sparse else \
                "deferred" if cls.decodes_in_blocks else None
        if kinds[key] and handed_to_merge(a, [nodes[v]["op"] for v in succ[n]]):
            out[n] = kinds[key]
    return out


def cost_key(graph: nx.DiGraph, node: Any, attrs: dict[str, Any], numel: int, handed: dict[Any, str]
             ) -> tuple | None:
    """What an op's compute cost depends on: ``(codec, elements charged, mode, inputs)``; None for sends and
    receives.  An encode's ``mode`` is its error feedback (bool); a decode's is how its merge takes it
    (``handed``, from :func:`handed_decodes`), else ``"shared"`` where another op reads it and it is no output
    (the executor runs ``Codec.decode_shared``), else False.  A merge's ``codec`` is the codec whose handed decodes
    it adds (a sparsifier's entries, or deferred decodes: ``mode`` True), None where none, and under a calibrated
    runtime picks its scale (``merge:<codec>``); its ``inputs`` is a pair: the inputs
    :func:`merged_inputs` charges it for with its deferred decodes counted as dense inputs (under a profile
    without their ``deferred`` cost), and with them priced on their own; each one fewer where an encode computes
    the merge (:func:`folded_merge`)."""
    op = attrs["op"]
    if op == "encode":
        return (attrs["codec"], numel, bool(attrs.get("ef")), 0)
    if op == "decode":
        # read by another op and no output: Codec.decode_shared (a compact template's stand-ins for other workers'
        # output decodes have no reader)
        shared = "shared" if graph._succ[node] and not attrs.get("output") else False
        return (attrs["codec"], numel, handed.get(node) or shared, 0)
    if op == "merge":
        preds = graph._pred[node]
        local = 1 if attrs.get("local_input") else 0
        sparse = sum(1 for u in preds if handed.get(u) == "entries") if handed else 0
        deferred = [u for u in preds if handed.get(u) == "deferred"] if handed else []
        dense = len(preds) - sparse - len(deferred) + local
        fold = 1 if folded_merge(graph, node, attrs) else 0
        whole = max(0, merged_inputs(dense + len(deferred), sparse) - fold)
        if not deferred:
            entries = next((graph.nodes[u]["codec"] for u in preds if handed.get(u) == "entries"), None) \
                if sparse else None
            return (entries, numel, False, (whole, whole))
        return (graph.nodes[deferred[0]]["codec"], numel, True,
                (whole, max(0, merged_inputs(dense, sparse + len(deferred)) - fold)))
    return None


def folded_merge(graph: nx.DiGraph, node: Any, attrs: dict[str, Any]) -> bool:
    """Whether the per-rank executor hands this merge to the error-feedback encode that reads it, which
    computes it as it adds its residual (:func:`casync.primitives.merge.handed_to_encode` and
    :func:`casync.primitives.merge.merges_in_encode`): the merged tensor is never written and read back, so the
    merge is charged one input pass fewer."""
    readers = [graph.nodes[v] for v in graph._succ[node]]
    if not handed_to_encode(attrs, readers):
        return False
    cls = codec_class(readers[0]["codec"])
    return cls is not None and merges_in_encode(cls)


def merged_inputs(dense: int, handed: int) -> int:
    """The inputs a merge is charged for: its dense ones, at least one where it adds ``handed`` inputs priced on
    their own (sparsifiers' entries, deferred decodes: its accumulator is then filled or copied once).  The
    planner's estimator counts the same way."""
    return max(1, dense) if handed else dense


def op_seconds(profile: Any, kind: int, key: tuple, runtime: bool = True) -> float:
    """Seconds of compute for an op of ``kind`` with cost ``key`` (:func:`cost_key`) under ``profile``;
    ``runtime=False``: at the profiled speed, without a calibrated runtime's scale."""
    codec, numel, mode, inputs = key
    if kind == ENCODE:
        return profile.encode_s(codec, numel, mode, runtime)
    if kind == DECODE:
        if mode == "entries":
            return profile.entries_s(codec, numel, runtime)
        if mode == "deferred":
            return profile.deferred_s(codec, numel, runtime)
        if mode == "shared":
            return profile.shared_s(codec, numel, runtime)
        return profile.decode_s(codec, numel, runtime)
    whole, deferred = inputs
    return profile.merge_s(numel, deferred if mode and profile.prices_deferred(codec) else whole, runtime, codec or "")
