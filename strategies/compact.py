"""Symmetric templates: one representative worker's share of a strategy, for simulating huge clusters.

In ring, all-gather and co-located PS every worker does the same work on a rotated share of the data,
so one worker's timeline is everyone's.  A template keeps only ``worker:0``'s ops; an op that would wait
for a payload from worker ``k`` instead waits for the matching send of ``worker:0`` itself (the same
event, shifted by symmetry).  Those send -> recv pairs stay on worker 0 but name the real peer, so the
simulator charges the real link.  Templates have O(N) ops per partition instead of O(N^2): a 1024-worker
ring of GPT-2 fits in memory.  They are for simulation only: engines refuse them.
"""
from __future__ import annotations

from .base import IDENTITY, GraphBuilder, Unit, server, worker  # noqa: F401 (server: roles)

ME = worker(0)


def ring(g: GraphBuilder, unit: Unit) -> None:
    """Worker 0's ring: for every N partitions (rotations of each other) one chain of N-1 reduce-scatter
    hops, the owner step and N-1 forwards — at hop r worker 0 works on the chunk r places behind its own."""
    n = unit.workers
    for part in range(0, len(unit.partitions), n):
        nxt, prv = worker(1 % n), worker((n - 1) % n)
        if n == 1:
            merged = g.merge(unit, part, ME, [], local_slot=0, divisor=unit.divisor, tag="rs")
        else:
            enc = g.encode(unit, part, ME, src=None, ef_role=ME, tag="rs0")
            payload, codec_of = enc, enc
            for hop in range(1, n):
                recv = _self_transfer(g, unit, part, payload, nxt, prv, codec_of, f"rs{hop}")
                dec = g.decode(unit, part, ME, recv, codec_of=codec_of, tag=f"rs{hop}")
                last = hop == n - 1
                merged = g.merge(unit, part, ME, [dec], local_slot=0, divisor=unit.divisor if last else 1,
                                 tag=f"rs{hop}")
                if last:
                    break
                payload = codec_of = g.encode(unit, part, ME, src=merged, ef_role=ME, tag=f"rs{hop}")
        final = g.encode(unit, part, ME, src=merged, ef_role=ME, tag="ag")
        g.decode(unit, part, ME, final, codec_of=final, output=True, tag="ag")
        payload = final
        for hop in range(1, n):
            payload = _self_transfer(g, unit, part, payload, nxt, prv, final, f"ag{hop}")
            g.decode(unit, part, ME, payload, codec_of=final, tag=f"ag{hop}")


def allgather(g: GraphBuilder, unit: Unit) -> None:
    """Worker 0 encodes once, sends to N-1 peers, decodes its own and N-1 received payloads, merges."""
    n = unit.workers
    for part in range(len(unit.partitions)):
        enc = g.encode(unit, part, ME, src=None, ef_role=ME, tag="ag")
        decoded = [g.decode(unit, part, ME, enc, codec_of=enc, tag="own")]
        for k in range(1, n):
            recv = _self_transfer(g, unit, part, enc, worker(k), worker(n - k), enc, f"ag{k}")
            decoded.append(g.decode(unit, part, ME, recv, codec_of=enc, tag=f"from{n - k}"))
        g.merge(unit, part, ME, decoded, local_slot=None, divisor=unit.divisor, output=True, tag="ag")


def ps(g: GraphBuilder, unit: Unit) -> None:
    """Co-located PS: worker 0 pushes its parts to the other servers and serves its own partitions.

    An optimistic template: pushes and pulls are scheduled as a perfect shifted exchange, so contention
    between one bucket's pulls and the next bucket's pushes is not modelled (full plans show it).
    """
    if unit.servers:
        raise ValueError("compact PS templates need co-located servers (servers=None)")
    n = unit.workers
    codec = unit.codec if unit.two_way else IDENTITY
    for part in range(len(unit.partitions)):
        if part % n:  # served elsewhere: by symmetry worker 0 serves its own partitions; parts of others cost
            continue  # worker 0 one push each, modelled below as the pushes into its own partition
        pushes = []
        for k in range(1, n):  # worker 0 pushes to server k; symmetric to worker n-k pushing to server 0
            enc = g.encode(unit, part, ME, src=None, ef_role=f"{ME}>{k}", tag=f"push{k}")
            recv = _self_transfer(g, unit, part, enc, worker(k), worker(n - k), enc, f"push{k}")
            pushes.append(g.decode(unit, part, ME, recv, codec_of=enc, tag=f"push{k}"))
        merged = g.merge(unit, part, ME, pushes, local_slot=0, divisor=unit.divisor, tag="ps")
        final = g.encode(unit, part, ME, src=merged, codec=codec, ef_role=server(0), tag="pull")
        g.decode(unit, part, ME, final, codec_of=final, output=True, tag="pull")
        for k in range(1, n):  # serve worker k; receive the pull of server n-k (symmetric)
            recv = _self_transfer(g, unit, part, final, worker(k), worker(n - k), final, f"pull{k}")
            g.decode(unit, part, ME, recv, codec_of=final, tag=f"pull{k}")


def _self_transfer(g: GraphBuilder, unit: Unit, part: int, payload: str, to: str, came_from: str, codec_of: str,
                   stage: str) -> str:
    """A send from worker 0 to ``to`` whose symmetric twin arrives at worker 0 from ``came_from``."""
    key = g.graph.nodes[codec_of]["codec"]
    n = unit.partitions[part][1] - unit.partitions[part][0]
    wire = g.codecs[key].compressed_nbytes(n)
    send = g.add(unit, part, ME, "send", f"{stage}.to.{to}", nbytes=wire, peer=to, codec=key, stage=stage)
    recv = g.add(unit, part, ME, "recv", f"{stage}.from.{came_from}", nbytes=wire, peer=came_from, codec=key,
                 stage=stage)
    g.connect(payload, send)
    g.connect(send, recv)
    return recv


TEMPLATES = {"ring": ring, "allgather": allgather, "ps": ps}
