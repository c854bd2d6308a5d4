"""CaSync-Ring: reduce-scatter hops that decode-merge-re-encode, then an all-gather that forwards the
owner's encoded chunk untouched and decodes it once per receiver (so every worker decodes the same bytes).

Per partition, with N workers (N >= 2): N encodes, 2N-1 decodes, N-1 merges, 2(N-1) sends and as many
recvs.  With one worker: 1 encode, 1 decode, 1 merge, no transfer.  Default partitions: N.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from casync.primitives.codecs import Codec
from casync.primitives.ir import worker

from .base import Strategy, Unit
from .builder import GraphBuilder

ME = worker(0)


class Ring(Strategy):
    name = "ring"
    summary = "CaSync-Ring: reduce-scatter with decode-merge-encode hops, then an all-gather of the owner's bytes"
    costs = {"encode": "K·N", "decode": "K·(2N−1)", "merge": "K·(N−1)", "send": "K·2(N−1)"}

    def expand(self, g: GraphBuilder, unit: Unit) -> None:
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

    def expand_compact(self, g: GraphBuilder, unit: Unit) -> None:
        """Worker 0's ring: for every N partitions (rotations of each other) one chain of N-1 reduce-scatter
        hops, the owner step and N-1 forwards; at hop r worker 0 works on the chunk r places behind its own.

        A template keeps only ``worker:0``'s ops; an op that would wait for a payload from worker k waits
        for the matching send of worker 0 itself (the same event, shifted by symmetry).  O(N) ops per
        partition instead of O(N^2)."""
        n = unit.workers
        if len(unit.partitions) % n:
            raise ValueError(f"a compact ring template needs whole rotations: a multiple of {n} partitions, got "
                             f"{len(unit.partitions)} for bucket {unit.bucket!r}")
        for part in range(0, len(unit.partitions), n):
            nxt, prv = worker(1 % n), worker((n - 1) % n)
            if n == 1:
                merged = g.merge(unit, part, ME, [], local_slot=0, divisor=unit.divisor, tag="rs")
            else:
                enc = g.encode(unit, part, ME, src=None, ef_role=ME, tag="rs0")
                payload, codec_of = enc, enc
                for hop in range(1, n):
                    recv = g.self_transfer(unit, part, payload, ME, nxt, prv, codec_of, f"rs{hop}")
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
                payload = g.self_transfer(unit, part, payload, ME, nxt, prv, final, f"ag{hop}")
                g.decode(unit, part, ME, payload, codec_of=final, tag=f"ag{hop}")

    def has_compact(self, unit_servers: int | None = None) -> bool:
        return True

    def op_count(self, workers: int, parts: int, servers: int | None = None) -> int:
        n = workers
        return parts * (8 * n - 6 if n > 1 else 3)

    def compact_op_count(self, workers: int, parts: int) -> int:
        return -(-parts // workers) * (8 * workers + 2)

    def compact_partitions(self, workers: int, parts: int, requested: int | None) -> int:
        return workers * max(1, (requested or workers) // workers)  # whole rotations: a multiple of N chunks

    def default_partitions(self, workers: int, servers: int | None = None) -> int:
        return workers

    def partition_candidates(self, workers: int) -> tuple[int, ...]:
        return (1, 2, 4, workers // 2, workers, 2 * workers)

    def estimate(self, est: Any, acc: Any, n: int, K: int, codec: Codec) -> tuple[float, int]:
        """Each partition walks the ring: N-1 reduce-scatter hops then N-1 forwards, pipelined when K > N."""
        N, o = est.N, est.o
        if N == 1:
            return est.single(acc, n, K, codec)
        # a hop decodes into its merge with the local chunk; the owner and the all-gather decode outputs
        E, D, M2 = est.enc(codec, n), est.dec(codec, n), est.merge_decoded(n, 1, 1, codec, encoded_by=codec)
        Dm = est.dec_merged(codec, n)
        B = codec.compressed_nbytes(n)
        ring = np.arange(N)
        X, lat = est.links(ring, (ring + 1) % N, B)
        hop_w = X + lat
        s = np.arange(K) % N
        wk = (s[:, None] + np.arange(N)[None, :]) % N          # (K, N): worker at chain position r
        hop = hop_w[wk]                                         # link from position r to r+1 (r=N-1: to pos 0)
        C0, Cmid = o + E, o + Dm + M2 + E
        cum = np.cumsum(hop[:, : N - 1], axis=1)                # cum[:, r-1] = sum of hops before position r
        arr = C0 + cum + np.arange(N - 1)[None, :] * Cmid       # arrival at positions 1..N-1
        send_rs = np.concatenate([np.full((K, 1), C0), arr[:, : N - 2] + Cmid], axis=1)  # positions 0..N-2
        t_own = arr[:, N - 2] + Cmid
        ag_arr = t_own[:, None] + hop[:, N - 1][:, None] + np.concatenate(
            [np.zeros((K, 1)), cum[:, : N - 2]], axis=1)       # arrival at positions 0..N-2
        ends = ag_arr[:, N - 2] + o + D
        L = float(ends.max())
        m = -(-K // N)
        if m > 1:  # partitions p and p+N walk the same chain at the same time: pipeline them
            L += (m - 1) * max(Cmid, float(X.max()))
        # compute lane
        acc.use(0, wk[:, 0], 0.0, C0, C0)
        if N > 2:
            acc.use(0, wk[:, 1: N - 1], arr[:, : N - 2], arr[:, : N - 2] + Cmid, Cmid)
        acc.use(0, wk[:, N - 1], arr[:, N - 2], t_own + D, Cmid + D)
        acc.use(0, wk[:, : N - 1], ag_arr, ag_arr + o + D, o + D)
        # NIC: reduce-scatter sends from positions 0..N-2, all-gather sends from the owner then 0..N-3
        xr = X[wk[:, : N - 1]]
        acc.use(1, wk[:, : N - 1], send_rs, send_rs + xr, xr)
        acc.use(2, wk[:, 1:], send_rs, send_rs + xr, xr)
        ag_src = np.concatenate([wk[:, N - 1: N], wk[:, : N - 2]], axis=1)
        ag_dst = wk[:, : N - 1]
        ag_start = np.concatenate([t_own[:, None], ag_arr[:, : N - 2]], axis=1)
        xa = X[ag_src]
        acc.use(1, ag_src, ag_start, ag_start + xa, xa)
        acc.use(2, ag_dst, ag_start, ag_start + xa, xa)
        acc.sent(est, np.concatenate([wk[:, : N - 1], ag_src], axis=1), 1, B)
        return L, K * 2 * (N - 1) * B
