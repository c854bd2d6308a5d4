"""``GraphBuilder``: adds primitive nodes with consistent ids and attributes (see ``casync.primitives.ir``) to a
DiGraph.

Strategies describe a bucket's sync through it: ``encode``, ``decode``, ``merge`` and ``transfer`` (a send on
one actor and its recv on another).  Node ids read like paths: ``"<bucket>/p<part>/<actor>/<op>[.<tag>]"``.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import networkx as nx

from casync.primitives.codecs import Codec, get_codec
from casync.primitives.ir import OPS

if TYPE_CHECKING:
    from .base import Unit

IDENTITY = get_codec("none")
_COMMON = ("op", "actor", "bucket", "part", "numel", "priority")  # what add() sets itself


def stable_hash(text: str) -> int:
    """A process-independent 63-bit hash (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


class GraphBuilder:
    """Builds one plan graph; ``codecs`` maps the string stored in each node's ``codec`` attribute to the codec."""

    def __init__(self, graph: nx.DiGraph | None = None):
        self.graph = graph if graph is not None else nx.DiGraph()
        self.codecs: dict[str, Codec] = {}
        self._wire: dict[tuple[str, int], int] = {}
        self._keys: dict[int, tuple[Codec, str]] = {}  # id(codec) -> (codec, key): str() of a codec is not free
        # the graph's own dictionaries, written directly (what DiGraph.add_node / add_edge store): plans are
        # built op by op, and networkx's per-call overhead showed
        self._node, self._succ, self._pred = self.graph._node, self.graph._succ, self.graph._pred

    def wire_nbytes(self, key: str, n: int) -> int:
        """``compressed_nbytes`` of codec ``key`` for ``n`` elements (memoized: a plan asks for few sizes)."""
        size = self._wire.get((key, n))
        if size is None:
            size = self._wire[(key, n)] = self.codecs[key].compressed_nbytes(n)
        return size

    def codec_key(self, codec: Codec) -> str:
        known = self._keys.get(id(codec))
        if known is not None and known[0] is codec:
            return known[1]
        key = str(codec)
        self.codecs.setdefault(key, codec)
        self._keys[id(codec)] = (codec, key)
        return key

    def add(self, unit: Unit, part: int, actor: str, op: str, tag: str = "", **attrs) -> str:
        """A node of primitive ``op`` on ``actor`` for partition ``part`` of ``unit``'s bucket."""
        assert op in OPS, op
        if not attrs.keys().isdisjoint(_COMMON):
            raise TypeError(f"add() got attributes it sets itself: {sorted(set(attrs) & set(_COMMON))}")
        start, stop = unit.partitions[part]
        return self._new(unit, part, actor, op, tag, stop - start, **attrs)

    def _put(self, node: str, attrs: dict) -> str:
        """Store node ``node`` with ``attrs`` (its attribute dict, in the order ``add`` gives them)."""
        nodes = self._node
        if node in nodes:
            raise ValueError(f"duplicate plan node {node!r}")
        self._succ[node] = {}
        self._pred[node] = {}
        nodes[node] = attrs
        return node

    def connect(self, src: str, dst: str, slot: int = 0) -> None:
        """A data dependency; ``slot`` orders the inputs of a merge."""
        if src in self._node and dst in self._node:
            data = {"slot": slot}  # one dict for both directions, as DiGraph.add_edge stores it
            self._succ[src][dst] = data
            self._pred[dst][src] = data
        else:
            self.graph.add_edge(src, dst, slot=slot)

    def _new(self, unit: Unit, part: int, actor: str, op: str, tag: str, numel: int, **attrs) -> str:
        """:meth:`add` without its checks, for this builder's own primitives (``numel``: the partition's size)."""
        a = {"op": op, "actor": actor, "bucket": unit.bucket, "part": part, "numel": numel, "priority": unit.priority}
        a.update(attrs)
        return self._put(f"{unit.bucket}/p{part}/{actor}/{op}.{tag}" if tag else f"{unit.bucket}/p{part}/{actor}/{op}",
                         a)

    def encode(self, unit: Unit, part: int, actor: str, *, src: str | None, codec: Codec | None = None,
               ef_role: str | None = None, tag: str = "") -> str:
        """Encode ``src``'s dense output (or, with ``src=None``, the actor's local gradient part)."""
        codec = codec or unit.codec
        start, stop = unit.partitions[part]
        n = stop - start
        use_ef = ef_role is not None and unit.ef and codec is unit.codec
        node = self._new(unit, part, actor, "encode", tag, n, codec=self.codec_key(codec), nbytes=4 * n,
                         local_input=src is None, ef=use_ef,
                         ef_key=f"{ef_role}/{unit.bucket}/{part}" if use_ef else None)
        self._node[node]["seed_key"] = stable_hash(node)
        if src is not None:
            self.connect(src, node)
        return node

    def decode(self, unit: Unit, part: int, actor: str, payload: str, *, codec_of: str, output: bool = False,
               tag: str = "") -> str:
        """Decode the payload produced by node ``payload`` (whose encode node is ``codec_of``)."""
        key = self._node[codec_of]["codec"]
        start, stop = unit.partitions[part]
        n = stop - start
        node = self._new(unit, part, actor, "decode", tag, n, codec=key, nbytes=self.wire_nbytes(key, n),
                         output=output)
        self.connect(payload, node)
        return node

    def merge(self, unit: Unit, part: int, actor: str, inputs: list[str], *, local_slot: int | None,
              divisor: int = 1, output: bool = False, tag: str = "") -> str:
        """Sum ``inputs`` (and the local gradient at position ``local_slot``) in that fixed order."""
        start, stop = unit.partitions[part]
        n = stop - start
        total = len(inputs) + (local_slot is not None)
        node = self._new(unit, part, actor, "merge", tag, n, nbytes=4 * n * total, local_input=local_slot is not None,
                         local_slot=local_slot, divisor=divisor, output=output)
        slots = [i for i in range(total) if i != local_slot]
        for src, slot in zip(inputs, slots):
            self.connect(src, node, slot)
        return node

    def transfer(self, unit: Unit, part: int, payload: str, src: str, dst: str, *, codec_of: str,
                 stage: str, round: int | None = None) -> str:
        """Move ``payload`` from actor ``src`` to ``dst`` as a send/recv pair; returns the recv node.

        ``round``: the send's place in a shifted exchange (see ``casync.primitives.ir``)."""
        return self._pair(unit, part, payload, src, dst, dst, src, codec_of, stage, round)

    def self_transfer(self, unit: Unit, part: int, payload: str, me: str, to: str, came_from: str, codec_of: str,
                      stage: str, round: int | None = None) -> str:
        """For symmetric templates: a send from ``me`` to ``to`` whose symmetric twin arrives at ``me`` from
        ``came_from`` (both ops stay on ``me``; the send names the real peer, so the link is charged).
        ``round``: the send's place in a shifted exchange, as in the full plan (see :meth:`transfer`)."""
        return self._pair(unit, part, payload, me, to, me, came_from, codec_of, stage, round)

    def _pair(self, unit: Unit, part: int, payload: str, sender: str, to: str, receiver: str, came_from: str,
              codec_of: str, stage: str, round: int | None) -> str:
        """A send on ``sender`` (peer ``to``) and its recv on ``receiver`` (peer ``came_from``), connected after
        ``payload``: what :meth:`transfer` and :meth:`self_transfer` add."""
        key = self._node[codec_of]["codec"]
        start, stop = unit.partitions[part]
        n = stop - start
        wire = self.wire_nbytes(key, n)
        send = self._new(unit, part, sender, "send", f"{stage}.to.{to}", n, nbytes=wire, peer=to, codec=key,
                         stage=stage)
        recv = self._new(unit, part, receiver, "recv", f"{stage}.from.{came_from}", n, nbytes=wire, peer=came_from,
                         codec=key, stage=stage)
        if round is not None:
            self._node[send]["round"] = round
        self.connect(payload, send)
        self.connect(send, recv)
        return recv
