"""All-gather: each worker encodes its partition once, the payload reaches every other worker, and every
worker decodes all N payloads and sums them in rank order (same bytes, same order: identical results).

Per partition, with N workers: N encodes, N*N decodes, N merges, N(N-1) sends and as many recvs.
Natural for sparse codecs, whose payloads are small.  Default partitions: 1.
"""
from __future__ import annotations

from .base import GraphBuilder, Unit, worker


def default_partitions(unit_workers: int, servers: int | None = None) -> int:
    return 1


def expand(g: GraphBuilder, unit: Unit) -> None:
    n = unit.workers
    for part in range(len(unit.partitions)):
        encoded = [g.encode(unit, part, worker(w), src=None, ef_role=worker(w), tag="ag") for w in range(n)]
        for v in range(n):
            here = worker(v)
            decoded = []
            for w in range(n):
                payload = encoded[w] if w == v else g.transfer(
                    unit, part, encoded[w], worker(w), here, codec_of=encoded[w], stage="ag")
                if w != v:  # shifted all-to-all: at round k every worker sends to the one k places ahead
                    g.graph.nodes[next(iter(g.graph.predecessors(payload)))]["round"] = (v - w) % n
                decoded.append(g.decode(unit, part, here, payload, codec_of=encoded[w], tag=f"from{w}"))
            g.merge(unit, part, here, decoded, local_slot=None, divisor=unit.divisor, output=True, tag="ag")
