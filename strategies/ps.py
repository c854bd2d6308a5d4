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

import math
from typing import Any

import numpy as np

from casync.primitives.codecs import Codec
from casync.primitives.ir import server, worker

from .base import Strategy, Unit
from .builder import IDENTITY, GraphBuilder

ME = worker(0)
#: With several partitions every worker both pushes and serves: its egress and ingress interfere.
COUPLING_SERVING = 0.5


class ParameterServer(Strategy):
    name = "ps"
    summary = "CaSync-PS: push encoded parts to servers, merge, (two-way) re-encode once, pull"
    costs = {"encode": "K·N (dedicated: K·(N+1))", "decode": "K·(2N−1) (dedicated: K·2N)", "merge": "K",
             "send": "K·2(N−1) (dedicated: K·2N)"}
    takes_servers = True

    def expand(self, g: GraphBuilder, unit: Unit) -> None:
        n = unit.workers
        n_servers = unit.servers or n
        for part in range(len(unit.partitions)):
            index = part % n_servers
            role = server(index)
            host = role if unit.servers else worker(index)
            host_rank = None if unit.servers else index
            # push: every other worker encodes its part and sends it to the server, in shifted rounds.
            decoded = []
            for w in range(n):
                if w == host_rank:
                    continue
                rnd = (index - w) % n
                enc = g.encode(unit, part, worker(w), src=None, ef_role=worker(w), tag="push")
                g.graph.nodes[enc]["round"] = rnd  # encode pushes in round order so they are ready in it
                recv = g.transfer(unit, part, enc, worker(w), host, codec_of=enc, stage="push", round=rnd)
                decoded.append(g.decode(unit, part, host, recv, codec_of=enc, tag=f"push.from{w}"))
            merged = g.merge(unit, part, host, decoded, local_slot=host_rank, divisor=unit.divisor, tag="ps")
            # pull: the aggregate is encoded once (identity codec for one-way PS) and decoded by every worker.
            codec = unit.codec if unit.two_way else IDENTITY
            final = g.encode(unit, part, host, src=merged, codec=codec, ef_role=role, tag="pull")
            for w in range(n):
                if w == host_rank:
                    g.decode(unit, part, host, final, codec_of=final, output=True, tag="pull")
                    continue
                recv = g.transfer(unit, part, final, host, worker(w), codec_of=final, stage="pull",
                                  round=(w - index) % n)
                g.decode(unit, part, worker(w), recv, codec_of=final, output=True, tag="pull")

    def expand_compact(self, g: GraphBuilder, unit: Unit) -> None:
        """Co-located PS as worker 0 sees it: it pushes its parts to the other hosts and serves its own.

        Partition p is hosted by worker p mod N, so with whole rotations (a multiple of N partitions,
        :meth:`compact_partitions`) every worker does the same work shifted by its rank: worker 0 hosts
        partitions 0, N, 2N, ...; its push to host k stands for its own push to k and for worker N-k's push
        into worker 0 (the same round of the shifted exchange), and likewise for pulls.  The simulated
        iteration equals the full plan's (tests/strategies/test_compact.py).  Dedicated servers are not
        interchangeable with workers, so they get no template (a clear error, never an approximation).
        """
        if unit.servers:
            raise ValueError(f"no compact template for PS with dedicated servers (servers={unit.servers}): servers "
                             "and workers do different work, so one representative worker cannot stand for both; "
                             "simulate the full plan (assemble_plan(..., compact=False))")
        n = unit.workers
        if len(unit.partitions) % n:
            raise ValueError(f"a compact PS template needs whole rotations: a multiple of {n} partitions, got "
                             f"{len(unit.partitions)} for bucket {unit.bucket!r}")
        codec = unit.codec if unit.two_way else IDENTITY
        for part in range(0, len(unit.partitions), n):  # worker 0 hosts partitions 0, N, 2N, ...
            pushes = []
            for k in range(1, n):  # worker 0 pushes to server k; symmetric to worker n-k pushing to server 0
                enc = g.encode(unit, part, ME, src=None, ef_role=f"{ME}>{k}", tag=f"push{k}")
                g.graph.nodes[enc]["round"] = k
                recv = g.self_transfer(unit, part, enc, ME, worker(k), worker(n - k), enc, f"push{k}", round=k)
                pushes.append(g.decode(unit, part, ME, recv, codec_of=enc, tag=f"push{k}"))
            merged = g.merge(unit, part, ME, pushes, local_slot=0, divisor=unit.divisor, tag="ps")
            final = g.encode(unit, part, ME, src=merged, codec=codec, ef_role=server(0), tag="pull")
            g.decode(unit, part, ME, final, codec_of=final, output=True, tag="pull")
            for k in range(1, n):  # serve worker k; receive the pull of server n-k (symmetric)
                recv = g.self_transfer(unit, part, final, ME, worker(k), worker(n - k), final, f"pull{k}", round=k)
                g.decode(unit, part, ME, recv, codec_of=final, tag=f"pull{k}")

    def has_compact(self, unit_servers: int | None = None) -> bool:
        return unit_servers is None

    def op_count(self, workers: int, parts: int, servers: int | None = None) -> int:
        n = workers
        return parts * max(7 * n + 2 if servers else 7 * n - 4, 3)

    def compact_op_count(self, workers: int, parts: int) -> int:
        return -(-parts // workers) * (7 * workers + 3)

    def compact_partitions(self, workers: int, parts: int, requested: int | None) -> int:
        return workers * max(1, -(-parts // workers))  # whole rotations: every worker hosts as many partitions

    def default_partitions(self, workers: int, servers: int | None = None) -> int:
        return servers or workers

    def partition_candidates(self, workers: int) -> tuple[int, ...]:
        return (1, 2, 4, workers // 2, workers, 2 * workers)

    def coupling(self, workers: int, parts: int) -> float:
        return COUPLING_SERVING if workers > 1 and parts > 1 else 0.0

    def variants(self) -> dict[str, dict[str, Any]]:
        return {"ps-oneway": {"strategy": "ps", "two_way": False}, "ps-twoway": {"strategy": "ps", "two_way": True}}

    def label(self, bucket: Any) -> str:
        return f"ps[{'2way' if bucket.two_way else '1way'},{'S=' + str(bucket.servers) if bucket.servers else 'coloc'}]"

    def estimate(self, est: Any, acc: Any, n: int, K: int, codec: Codec) -> tuple[float, int]:
        """Co-located PS: pushes in shifted rounds, hosts decode as pushes arrive, merge, re-encode, pull."""
        N, o = est.N, est.o
        pull = codec if est.two_way else IDENTITY
        if N == 1:
            return est.single(acc, n, K, pull)
        E, D = est.enc(codec, n), est.dec_merged(codec, n)
        Ep, Dp = est.enc(pull, n), est.dec(pull, n)
        M = est.merge_decoded(n, N - 1, 1, codec, encoded_by=pull)
        B, Bp = codec.compressed_nbytes(n), pull.compressed_nbytes(n)
        w = np.arange(N)
        hosts = np.unique(np.arange(K) % N)
        m = -(-K // N)  # partitions per host (at most)
        # one transfer's seconds and latency, taken as the slowest link (cross-node when there is one)
        Xa, lat_a = est.links(w, (w + 1) % N, B)
        Ya, _ = est.links(w, (w + 1) % N, Bp)
        X, Y, lat = float(Xa.max()), float(Ya.max()), float(lat_a.max())
        s_push, s_total = est.slots("ps", K)
        s_pull = s_total - s_push
        pushes = np.array([sum(1 for p in range(K) if p % N != v) for v in range(N)])
        hosted = np.bincount(np.arange(K) % N, minlength=N)
        ready = o + E
        push_end = ready + s_push * X
        # a host decodes N-1 pushes per partition as they arrive, then merges and re-encodes its partitions
        dec_end = max(push_end + lat + D, ready + X + lat + m * (N - 1) * D) + o
        T = dec_end + m * (M + Ep)
        pull_end = T + s_pull * Y
        L = pull_end + lat + o + Dp * max(1, math.ceil(K / N))
        # compute: encodes of K partitions (those not hosted), pull decodes; hosts decode, merge, re-encode
        enc_work = o + pushes * E
        acc.use(0, w, 0.0, ready + (pushes - 1).clip(0) * E, enc_work)
        acc.use(0, w, T, L, o + (K - hosted) * Dp)
        host_work = o + hosted * ((N - 1) * D + M + Ep + Dp)
        acc.use(0, hosts, ready + X + lat, T + Dp, host_work[hosts])
        # NIC: busy seconds, stretched by how far the exchange falls short of a perfect schedule (the
        # list scheduling's gaps are lost to the next buckets too: lanes are never backfilled)
        ideal = max(int(pushes.max()), (N - 1) * int(hosted.max())) + max((N - 1) * int(hosted.max()),
                                                                          int((K - hosted).max()))
        stretch = max(1.0, s_total / ideal)
        acc.use(1, w, ready, push_end, stretch * pushes * X)
        acc.use(1, hosts, T, pull_end, stretch * hosted[hosts] * (N - 1) * Y)
        acc.use(2, hosts, ready, push_end, stretch * hosted[hosts] * (N - 1) * X)
        acc.use(2, w, T, pull_end, stretch * (K - hosted) * Y)
        acc.sent(est, w, pushes, B)
        acc.sent(est, hosts, hosted[hosts] * (N - 1), Bp)
        return L, K * (N - 1) * (B + Bp)
