"""All-gather: each worker encodes its partition once, the payload reaches every other worker, and every
worker decodes all N payloads and sums them in rank order (same bytes, same order: identical results).

Per partition, with N workers: N encodes, N*N decodes, N merges, N(N-1) sends and as many recvs.
Natural for sparse codecs, whose payloads are small.  Default partitions: 1.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from casync.primitives.codecs import Codec
from casync.primitives.ir import worker

from .base import Strategy, Unit
from .builder import GraphBuilder

ME = worker(0)


class AllGather(Strategy):
    name = "allgather"
    summary = "every worker encodes once and sends to every other; each decodes all N and sums in rank order"
    costs = {"encode": "K·N", "decode": "K·N²", "merge": "K·N", "send": "K·N(N−1)"}

    def expand(self, g: GraphBuilder, unit: Unit) -> None:
        n = unit.workers
        for part in range(len(unit.partitions)):
            encoded = [g.encode(unit, part, worker(w), src=None, ef_role=worker(w), tag="ag") for w in range(n)]
            for v in range(n):
                here = worker(v)
                decoded = []
                for w in range(n):
                    # shifted all-to-all: at round k every worker sends to the one k places ahead
                    payload = encoded[w] if w == v else g.transfer(
                        unit, part, encoded[w], worker(w), here, codec_of=encoded[w], stage="ag", round=(v - w) % n)
                    decoded.append(g.decode(unit, part, here, payload, codec_of=encoded[w], tag=f"from{w}"))
                g.merge(unit, part, here, decoded, local_slot=None, divisor=unit.divisor, output=True, tag="ag")

    def expand_compact(self, g: GraphBuilder, unit: Unit) -> None:
        """Worker 0 encodes once, sends to N-1 peers, decodes its own and N-1 received payloads, merges."""
        n = unit.workers
        for part in range(len(unit.partitions)):
            enc = g.encode(unit, part, ME, src=None, ef_role=ME, tag="ag")
            decoded = [g.decode(unit, part, ME, enc, codec_of=enc, tag="own")]
            for k in range(1, n):
                recv = g.self_transfer(unit, part, enc, ME, worker(k), worker(n - k), enc, f"ag{k}", round=k)
                decoded.append(g.decode(unit, part, ME, recv, codec_of=enc, tag=f"from{n - k}"))
            g.merge(unit, part, ME, decoded, local_slot=None, divisor=unit.divisor, output=True, tag="ag")

    def has_compact(self, unit_servers: int | None = None) -> bool:
        return True

    def op_count(self, workers: int, parts: int, servers: int | None = None) -> int:
        return parts * max(3 * workers * workers, 3)

    def compact_op_count(self, workers: int, parts: int) -> int:
        return parts * (3 * workers + 3)

    def default_partitions(self, workers: int, servers: int | None = None) -> int:
        return 1

    def partition_candidates(self, workers: int) -> tuple[int, ...]:
        return (1, 2, 4)

    def estimate(self, est: Any, acc: Any, n: int, K: int, codec: Codec) -> tuple[float, int]:
        """Every worker encodes, sends N-1 copies in shifted rounds, decodes N payloads and merges them."""
        N, o = est.N, est.o
        if N == 1:
            return est.single(acc, n, K, codec)
        E, D, M = est.enc(codec, n), est.dec_merged(codec, n), est.merge_decoded(n, N, 0, codec)
        B = codec.compressed_nbytes(n)
        w = np.arange(N)
        Xa, lat_a = est.links(w, (w + 1) % N, B)
        X, lat = float(Xa.max()), float(lat_a.max())
        s = est.slots("ag", K)[1]
        ready = o + E
        net_end = ready + s * X
        compute = 2 * o + K * (E + N * D + M)
        L = max(net_end + lat + D + M + o, compute + X + lat)
        acc.use(0, w, 0.0, L, compute)
        acc.use(1, w, ready, net_end, K * (N - 1) * X)
        acc.use(2, w, ready, net_end, K * (N - 1) * X)
        acc.sent(est, w, K * (N - 1), B)
        return L, K * N * (N - 1) * B
