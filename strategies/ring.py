"""CaSync-Ring: reduce-scatter hops that decode-merge-re-encode, then an all-gather that forwards the
owner's encoded chunk untouched and decodes it once per receiver (so every worker decodes the same bytes).

Per partition, with N workers (N >= 2): N encodes, 2N-1 decodes, N-1 merges, 2(N-1) sends and as many
recvs.  With one worker: 1 encode, 1 decode, 1 merge, no transfer.  Default partitions: N.
"""
from __future__ import annotations

from .base import GraphBuilder, Unit, worker


def default_partitions(unit_workers: int, servers: int | None = None) -> int:
    return unit_workers


def expand(g: GraphBuilder, unit: Unit) -> None:
    n = unit.workers
    for part in range(len(unit.partitions)):
        start = part % n
        order = [worker((start + r) % n) for r in range(n)]
        owner = order[-1]
        # reduce-scatter: the chunk travels order[0] -> ... -> owner, accumulating.
        carried = None  # (payload node, encode node) arriving at the next hop
        if n > 1:
            enc = g.encode(unit, part, order[0], src=None, ef_role=order[0], tag="rs")
            carried = (g.transfer(unit, part, enc, order[0], order[1], codec_of=enc, stage="rs"), enc)
        for r in range(1, n):
            actor = order[r]
            dec = g.decode(unit, part, actor, carried[0], codec_of=carried[1], tag="rs")
            last = r == n - 1
            merged = g.merge(unit, part, actor, [dec], local_slot=0, divisor=unit.divisor if last else 1,
                             tag="rs")
            if last:
                break
            enc = g.encode(unit, part, actor, src=merged, ef_role=actor, tag="rs")
            carried = (g.transfer(unit, part, enc, actor, order[r + 1], codec_of=enc, stage="rs"), enc)
        if n == 1:
            merged = g.merge(unit, part, owner, [], local_slot=0, divisor=unit.divisor, tag="rs")
        # all-gather: the owner encodes the reduced chunk once; every worker decodes those same bytes.
        final = g.encode(unit, part, owner, src=merged, ef_role=owner, tag="ag")
        g.decode(unit, part, owner, final, codec_of=final, output=True, tag="ag")
        payload, here = final, owner
        for r in range(n - 1):
            nxt = worker((start + r) % n)  # owner+1, owner+2, ... wraps to order[0] first
            recv = g.transfer(unit, part, payload, here, nxt, codec_of=final, stage="ag")
            g.decode(unit, part, nxt, recv, codec_of=final, output=True, tag="ag")
            payload, here = recv, nxt
