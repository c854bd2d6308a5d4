"""CaSync-PS: partitions spread over servers; workers push encoded parts, a server decodes and merges
them in rank order, then (two-way) re-encodes the aggregate once and every worker decodes those bytes.

Servers are dedicated actors (``servers=S``) or co-located on the workers (``servers=None``: partition p
is served by worker p mod N, whose own contribution is merged locally without compression).
One-way PS (``two_way=False``) sends the aggregate back uncompressed.

Per partition, N workers:
* co-located: N encodes, 2N-1 decodes, 1 merge, 2(N-1) sends and as many recvs;
* dedicated:  N+1 encodes, 2N decodes, 1 merge, 2N sends and as many recvs.
Default partitions: the number of servers (N when co-located).
"""
from __future__ import annotations

from .base import IDENTITY, GraphBuilder, Unit, server, worker


def default_partitions(unit_workers: int, servers: int | None = None) -> int:
    return servers or unit_workers


def expand(g: GraphBuilder, unit: Unit) -> None:
    n = unit.workers
    n_servers = unit.servers or n
    for part in range(len(unit.partitions)):
        index = part % n_servers
        role = server(index)
        host = role if unit.servers else worker(index)
        host_rank = None if unit.servers else index
        # push: every other worker encodes its part and sends it to the server.
        decoded = []
        for w in range(n):
            if w == host_rank:
                continue
            enc = g.encode(unit, part, worker(w), src=None, ef_role=worker(w), tag="push")
            recv = g.transfer(unit, part, enc, worker(w), host, codec_of=enc, stage="push")
            g.graph.nodes[next(iter(g.graph.predecessors(recv)))]["round"] = (index - w) % n  # shifted pushes
            g.graph.nodes[enc]["round"] = (index - w) % n  # encode pushes in round order so they are ready in it
            decoded.append(g.decode(unit, part, host, recv, codec_of=enc, tag=f"push.from{w}"))
        merged = g.merge(unit, part, host, decoded, local_slot=host_rank, divisor=unit.divisor, tag="ps")
        # pull: the aggregate is encoded once (identity codec for one-way PS) and decoded by every worker.
        codec = unit.codec if unit.two_way else IDENTITY
        final = g.encode(unit, part, host, src=merged, codec=codec, ef_role=role, tag="pull")
        for w in range(n):
            if w == host_rank:
                g.decode(unit, part, host, final, codec_of=final, output=True, tag="pull")
                continue
            recv = g.transfer(unit, part, final, host, worker(w), codec_of=final, stage="pull")
            g.graph.nodes[next(iter(g.graph.predecessors(recv)))]["round"] = (w - index) % n
            g.decode(unit, part, worker(w), recv, codec_of=final, output=True, tag="pull")
