"""``SyncPlan``: the one data structure every engine shares — a DAG of primitives plus what it was built from.

The plan says *what* happens (plain-data node attributes, see docs/design.md); engines decide *how*.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from casync.primitives.codecs import Codec
from casync.primitives.ir import OPS, Actor

from ..table import format_table, human_bytes
from .specs import Bucket, Member, TensorSpec

if TYPE_CHECKING:  # networkx and the strategies are imported where used: actors that hold a plan rarely need them
    import networkx as nx


@dataclass
class SyncPlan:
    """A sync plan: ``graph`` (networkx DiGraph of primitives), ``tensors`` (backward order), ``buckets``."""

    graph: nx.DiGraph
    tensors: list[TensorSpec]
    buckets: list[Bucket]
    workers: int
    codecs: dict[str, Codec]
    options: dict[str, Any] = field(default_factory=dict)
    compact: bool = False  # a symmetric template (one representative worker): simulation only

    def require_executable(self, engine: str) -> None:
        """Engines call this: a compact template cannot be executed, only simulated."""
        if self.compact:
            raise ValueError(f"{engine} cannot run a compact (template) plan; build it with compact=False")

    # -- lookups -------------------------------------------------------------
    @property
    def seed(self) -> int:
        return int(self.options.get("seed", 0))

    @property
    def nonfinite(self) -> str:
        """What engines do with NaN/Inf gradients: ``"raise"`` (default), ``"skip"`` or ``"propagate"``."""
        return self.options.get("nonfinite", "raise")

    @property
    def actors(self) -> list[str]:
        """Every actor the plan uses: workers first, then dedicated servers."""
        names = {a for _, a in self.graph.nodes(data="actor")} | {f"worker:{w}" for w in range(self.workers)}
        return sorted(names, key=Actor.sort_key)

    def bucket(self, name: str) -> Bucket:
        for b in self.buckets:
            if b.name == name:
                return b
        raise KeyError(f"no bucket named {name!r}")

    def locate(self, tensor: str) -> tuple[Bucket, Member]:
        """The bucket a tensor was fused into (its own, when it is large) and its place there."""
        index = self.__dict__.get("_members")
        if index is None:
            index = self.__dict__["_members"] = {m.spec.name: (b, m) for b in self.buckets for m in b.members}
        try:
            return index[tensor]
        except KeyError:
            raise KeyError(f"no tensor named {tensor!r} in the plan") from None

    def bucket_of(self, tensor: str) -> Bucket:
        return self.locate(tensor)[0]

    def bucket_name(self, name: str | None) -> str | None:
        """``name`` if it names a bucket, else the bucket of the tensor it names (None stays None)."""
        if name is None or any(b.name == name for b in self.buckets):
            return name
        return self.locate(name)[0].name

    def nodes(self, bucket: str | None = None, op: str | None = None, actor: str | None = None) -> Iterator[str]:
        """Node ids filtered by bucket (or tensor) name, primitive and actor."""
        bucket = self.bucket_name(bucket)
        for node, a in self.graph.nodes(data=True):
            if (bucket is None or a["bucket"] == bucket) and (op is None or a["op"] == op) and (
                    actor is None or a["actor"] == actor):
                yield node

    def op_counts(self, bucket: str | None = None) -> dict[str, int]:
        """How many ops of each primitive a bucket (or the whole plan) has."""
        bucket = self.bucket_name(bucket)
        counts = Counter(a["op"] for _, a in self.graph.nodes(data=True) if bucket is None or a["bucket"] == bucket)
        return {op: counts.get(op, 0) for op in OPS}

    def wire_bytes(self, bucket: str | None = None) -> int:
        """Bytes all sends of a bucket (or the whole plan) put on the wire in one iteration."""
        bucket = self.bucket_name(bucket)
        return sum(a["nbytes"] for _, a in self.graph.nodes(data=True)
                   if a["op"] == "send" and (bucket is None or a["bucket"] == bucket))

    def topological_order(self) -> list[str]:
        """A deterministic topological order: earlier-ready buckets first, then by node id."""
        import networkx as nx

        attrs = self.graph.nodes
        return list(nx.lexicographical_topological_sort(self.graph, key=lambda n: (attrs[n]["priority"], n)))

    # -- files -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: format name and version, options, codec specs, tensors, buckets, graph."""
        from .io import plan_to_dict

        return plan_to_dict(self)

    @classmethod
    def from_dict(cls, data: Any, source: str = "plan") -> "SyncPlan":
        """Rebuild (and validate) a plan from :meth:`to_dict` output; ``PlanFormatError`` names a bad field."""
        from .io import plan_from_dict

        return plan_from_dict(data, source, cls)

    def save(self, path: str) -> str:
        """Write the plan as versioned JSON (never pickle); ``SyncPlan.load(path)`` reads it back."""
        from .io import save_plan

        return str(save_plan(self, path))

    @classmethod
    def load(cls, path: str) -> "SyncPlan":
        """Read a plan written by :meth:`save`, validating every field against the format."""
        from .io import load_plan

        return load_plan(path, cls)

    def __eq__(self, other: object) -> bool:
        """Plans are equal when they hold the same data (graph included), as a save/load round trip keeps."""
        if not isinstance(other, SyncPlan):
            return NotImplemented
        return self is other or self.to_dict() == other.to_dict()

    __hash__ = None  # mutable

    # -- views -------------------------------------------------------------
    def summary(self) -> str:
        """One row per bucket: its tensors (count, first and last), strategy, codec, partitions, wire bytes,
        op counts and the planner's note.  ``explain(tensor)`` tells one tensor's story."""
        from casync.strategies import get_strategy

        from .explain import members_label

        rows = []
        counts = Counter((a["bucket"], a["op"]) for _, a in self.graph.nodes(data=True))
        wires = Counter()
        for _, a in self.graph.nodes(data=True):
            if a["op"] == "send":
                wires[a["bucket"]] += a["nbytes"]
        for b in self.buckets:
            strategy = get_strategy(b.strategy).label(b)
            rows.append([b.name, members_label(b), b.numel, strategy,
                         str(b.codec) + ("+ef" if b.uses_error_feedback else ""), len(b.partitions),
                         human_bytes(wires[b.name])] + [counts[(b.name, op)] for op in ("encode", "decode", "merge",
                                                                                           "send")] + [b.note])
        total = self.op_counts()
        raw = 4 * sum(t.numel for t in self.tensors)
        wire = self.wire_bytes()
        rows.append(["TOTAL", f"{len(self.tensors)}", sum(b.numel for b in self.buckets), "", "", "",
                     human_bytes(wire), total["encode"], total["decode"], total["merge"], total["send"], ""])
        head = (f"SyncPlan: {len(self.tensors)} tensors in {len(self.buckets)} buckets, {self.workers} workers, "
                f"{len(self.actors)} actors, {self.graph.number_of_nodes()} ops; "
                f"{human_bytes(raw)} of gradients per worker, {human_bytes(wire)} on the wire per iteration")
        table = format_table(["bucket", "tensors", "numel", "strategy", "codec", "parts", "wire", "enc", "dec",
                              "merge", "send", "note"], rows)
        return head + "\n" + table

    def explain(self, name: str) -> str:
        """Where tensor (or bucket) ``name`` went: its bucket and place there, strategy, codec, error feedback,
        partitions, bytes on the wire and why (the planner's note, or the caller's choice).  KeyError with
        close matches for an unknown name."""
        from .explain import explain

        return explain(self, name)

    def table(self, bucket: str | None = None) -> str:
        """Every node as a row (like ``torch.fx.Graph.print_tabular``), in execution order; ``bucket``: only
        that bucket's, or the bucket of the tensor it names (``KeyError`` for a name the plan does not hold)."""
        bucket = self.bucket_name(bucket)
        rows = []
        for node in self.topological_order():
            a = self.graph.nodes[node]
            if bucket is not None and a["bucket"] != bucket:
                continue
            inputs = [u for u, _, _ in sorted(self.graph.in_edges(node, data="slot"), key=lambda e: e[2])]
            rows.append([node, a["op"], a["actor"], a["part"], a["nbytes"], a.get("peer") or "",
                         a.get("codec") or "", ", ".join(inputs)])
        return format_table(["node", "op", "actor", "part", "nbytes", "peer", "codec", "inputs"], rows)

    def to_dot(self, bucket: str | None = None) -> str:
        """Graphviz DOT text: one cluster per actor, send->recv edges dashed."""
        from ..drawing import plan_to_dot

        return plan_to_dot(self, self.bucket_name(bucket))

    def draw(self, path: str, bucket: str | None = None, max_nodes: int = 400) -> str:
        """Write a PNG (matplotlib): actors as lanes, ops left to right by dependency depth."""
        from ..drawing import draw_plan

        return draw_plan(self, path, bucket=self.bucket_name(bucket), max_nodes=max_nodes)

    def __repr__(self) -> str:
        return (f"SyncPlan(tensors={len(self.tensors)}, buckets={len(self.buckets)}, workers={self.workers}, "
                f"ops={self.graph.number_of_nodes()}{', compact' if self.compact else ''})")
