"""Automatic per-bucket planning: compress or not, which codec, which strategy, how many partitions.

``build_plan(..., strategy="auto", codec="auto", partitions="auto", cluster=ClusterModel(...))`` lands here
(:func:`choose_plan`).  The algorithm follows Espresso (ByteComp) and HiPress:

1. **Candidates.**  Every bucket may use any candidate strategy (``ring``, co-located two-way ``ps``,
   ``allgather``), any candidate codec (default ``none``, ``fp16``, ``onebit``, ``topk:ratio=0.01``) and a
   few partition counts per strategy (1, 2, 4, N/2, N, 2N and the strategy default, never cutting parts
   below ``MIN_PARTITION_NUMEL`` elements).  Options a bucket never wants — slower in isolation *and* using
   more of every resource than another option — are pruned (HiPress's selective compression and
   partitioning: compress and split only where the isolated cost model says it pays).
2. **Fast estimator.**  Each (bucket size, option) gets analytical stage costs from the :class:`Profile`
   and the :class:`ClusterModel`, memoized: per worker, the seconds its compute lane, NIC egress and NIC
   ingress are busy (``alpha + bytes/beta`` per transfer, encode/decode/merge per element, per-task call
   overhead), when that use starts and how long the bucket still runs after it ends, and the bucket's
   isolated makespan (the hop-latency chain of one partition, plus pipelining of several).  A pipelined
   timeline over the buckets in ready order — one compute and one network resource per worker, as in
   Espresso's timeline model — combines them into an estimated iteration time in microseconds, and
   evaluates all options of one bucket at once (NumPy, batched).
3. **Greedy choice (Espresso).**  Starting from the best uncompressed plan, buckets are visited in priority
   order — largest first, later-ready first among equals; a bucket whose synchronization already hides in
   a bubble (done before the next gradient is ready) is skipped; otherwise it keeps the option that lowers
   the estimated iteration time most.  Passes repeat until nothing improves; the uniform fixed plans (one
   strategy and codec for every bucket) are also estimated and improved the same way, so the result
   starts from the best of them.
4. **Validation.**  The chosen plan and the most promising uniform fixed plans are expanded and run
   through the real :func:`casync.simulator.simulate` within an op budget; the best simulated one is
   kept.  On small plans the choice is then refined greedily bucket by bucket with the real simulator.

Each bucket's ``note`` says why it got its option, e.g. ``"onebit: -12.3 ms vs none"`` (the predicted
iteration time saved against the best uncompressed option for that bucket, other buckets unchanged),
``"hidden in bubble"`` or ``"small: kept uncompressed"``.

:func:`backward_ready_times` gives a plausible backward-pass profile for ``ready_times``.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from primitives.codecs import Codec, get_codec
from strategies import get_strategy

from . import build as _build
from .costmodel import ClusterModel, Profile
from .plan import SyncPlan
from .specs import TensorSpec
from .tensors import tensor_specs

DEFAULT_STRATEGIES: tuple[str, ...] = ("ring", "ps", "allgather")
DEFAULT_CODECS: tuple[str, ...] = ("none", "fp16", "onebit", "topk:ratio=0.01")
#: Real-simulator budget of a planning call, in plan ops simulated (about 15 us each, building included).
DEFAULT_SIM_BUDGET_OPS = 120_000
#: Plans up to this many ops are refined bucket by bucket with the real simulator (budget permitting).
REFINE_MAX_OPS = 4_000
_TOL = 1e-9  # seconds: smaller estimated differences are ties


# ---------------------------------------------------------------------------------------------------------
# Backward-pass profile
# ---------------------------------------------------------------------------------------------------------

def backward_ready_times(tensors: Any, total_backward_s: float, start_s: float = 0.0) -> dict[str, float]:
    """When each gradient becomes ready in a backward pass of ``total_backward_s`` seconds.

    ``tensors`` is anything :func:`casync.build_plan` accepts (a built-in model name, a torch module, a
    mapping or list of shapes), taken in backward order.  Gradients become ready one after the other in
    that order and the backward time is shared out in proportion to parameter count (a FLOP proxy: a
    layer's weight-gradient GEMM scales with its weight size), so tensor ``i`` is ready at
    ``start_s + total_backward_s * (params of tensors 0..i) / (all params)``; the last gradient is ready at
    ``start_s + total_backward_s``.  Returns ``{tensor name: seconds}`` for ``ready_times=``.
    """
    if isinstance(total_backward_s, bool) or not isinstance(total_backward_s, (int, float)) \
            or not math.isfinite(total_backward_s) or total_backward_s < 0:
        raise ValueError(f"total_backward_s must be a non-negative number of seconds, got {total_backward_s!r}")
    if isinstance(start_s, bool) or not isinstance(start_s, (int, float)) or not math.isfinite(start_s) \
            or start_s < 0:
        raise ValueError(f"start_s must be a non-negative number of seconds, got {start_s!r}")
    specs = tensor_specs(tensors)
    total = sum(s.numel for s in specs)
    out, acc = {}, 0
    for i, spec in enumerate(specs):
        acc += spec.numel
        share = acc / total if total else (i + 1) / len(specs)
        out[spec.name] = float(start_s + total_backward_s * share)
    return out


# ---------------------------------------------------------------------------------------------------------
# Options and their estimated costs
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One way to synchronize a bucket: strategy, codec and partition count."""

    strategy: str
    codec: Codec
    partitions: int

    @property
    def compressed(self) -> bool:
        return not self.codec.lossless or self.codec.name != "none"

    def label(self) -> str:
        return f"{self.codec} {self.strategy}x{self.partitions}"


@dataclass
class _Cost:
    """Estimated isolated behaviour of one bucket option (resources: compute, egress, ingress per worker)."""

    L: float                # isolated makespan, from ready to the last op's end
    head: np.ndarray        # per resource: when its first use starts (offset from ready)
    work: np.ndarray        # per resource: seconds busy
    tail: np.ndarray        # per resource: L - end of its last use (-inf where unused)
    wire: int               # bytes all sends put on the wire
    ops: int                # plan nodes
    coupling: float = 0.0   # all-to-all traffic: a worker's egress and ingress wait for each other


def _op_count(strategy: str, n: int, k: int) -> int:
    if n == 1:
        return 3 * k
    if strategy == "ring":
        per = n + (2 * n - 1) + (n - 1) + 4 * (n - 1)
    elif strategy == "ps":
        per = n + (2 * n - 1) + 1 + 4 * (n - 1)
    else:
        per = n + n * n + n + 2 * n * (n - 1)
    return k * per


class Estimator:
    """Fast analytical stand-in for :func:`casync.simulator.simulate` over per-bucket options.

    Resources are indexed ``[compute(N) | egress(N) | ingress(N) | node cores (if modelled)]``.
    """

    #: Calibration of the resource-bound term against the simulator's list scheduling (no backfilling:
    #: transfers that need two NIC lanes at once leave gaps).
    PHI = {"ring": 1.0, "ps": 1.0, "allgather": 1.0}
    #: How much of a worker's ingress work delays its egress (and back) when transfers go all-to-all: a
    #: send needs its sender's egress and its receiver's ingress at once and the simulator never
    #: backfills, so in an all-gather a NIC's two lanes are busy about as long as both together
    #: (2N-3 transfer slots for N-1 sends).  Ring transfers pair worker w's egress with w+1's ingress only.
    COUPLING = {"ring": 0.0, "ps": 0.5, "allgather": 1.0}

    def __init__(self, workers: int, cluster: ClusterModel, profile: Profile, *, error_feedback: bool = True,
                 two_way: bool = True):
        self.N = workers
        self.cluster = cluster
        self.profile = profile
        self.error_feedback = error_feedback
        self.two_way = two_way
        self.o = profile.task_overhead_s
        self.node = np.array([cluster.node_of(f"worker:{w}") for w in range(workers)])
        self.nodes = int(self.node.max()) + 1 if workers else 1
        self.cores = cluster.cores_per_node
        self.lanes = cluster.compute_lanes
        self.R = 3 * workers + (self.nodes if self.cores else 0)
        self._memo: dict[tuple, _Cost] = {}
        self._none = get_codec("none")

    # -- link and op costs -----------------------------------------------------------------------------
    def _links(self, src: np.ndarray, dst: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        """Transfer seconds and extra latency of sends ``src[i] -> dst[i]`` of ``nbytes`` each."""
        same = self.node[src] == self.node[dst]
        local = self.profile.local_transfer_s(nbytes)
        remote = self.profile.transfer_alpha_s + nbytes / self.cluster.bytes_per_s
        x = np.where(same, local, remote)
        lat = np.where(same, 0.0, self.cluster.latency_us * 1e-6)
        return x, lat

    def _enc(self, codec: Codec, n: int) -> float:
        return self.profile.encode_s(str(codec), n, self.error_feedback and not codec.lossless)

    def _dec(self, codec: Codec, n: int) -> float:
        return self.profile.decode_s(str(codec), n)

    # -- public --------------------------------------------------------------------------------------------
    def cost(self, numel: int, option: Option) -> _Cost:
        key = (numel, option.strategy, str(option.codec), option.partitions)
        c = self._memo.get(key)
        if c is None:
            c = self._memo[key] = self._compute(numel, option)
        return c

    def _compute(self, numel: int, option: Option) -> _Cost:
        N, K = self.N, max(1, min(option.partitions, numel)) if numel else 1
        n = -(-numel // K) if numel else 0
        codec = option.codec
        acc = _Acc(N)
        if N == 1:
            L, wire = self._single(acc, n, K, option)
        elif option.strategy == "ring":
            L, wire = self._ring(acc, n, K, codec)
        elif option.strategy == "ps":
            L, wire = self._ps(acc, n, K, codec)
        else:
            L, wire = self._allgather(acc, n, K, codec)
        return self._finish(acc, L, wire, _op_count(option.strategy, N, K), option.strategy)

    def _finish(self, acc: "_Acc", L: float, wire: int, ops: int, strategy: str) -> _Cost:
        N = self.N
        work = np.concatenate([acc.work[0] / self.lanes, acc.work[1], acc.work[2]])
        first = np.concatenate(acc.first)
        last = np.concatenate(acc.last)
        used = work > 0
        head_min = float(first[used].min()) if used.any() else 0.0
        tail_min = float((L - last[used]).min()) if used.any() else 0.0
        if self.cores:
            node_work = np.zeros(self.nodes)
            np.add.at(node_work, self.node, acc.work[0] / min(self.cores, self.lanes * max(1, self._wpn())))
            node_first = np.full(self.nodes, np.inf)
            node_last = np.full(self.nodes, -np.inf)
            np.minimum.at(node_first, self.node, acc.first[0])
            np.maximum.at(node_last, self.node, acc.last[0])
            work = np.concatenate([work, node_work])
            first = np.concatenate([first, node_first])
            last = np.concatenate([last, node_last])
            used = work > 0
        # several partitions share lanes: the bucket cannot finish before its busiest resource is done
        bound = head_min + self.PHI[strategy] * float(work.max(initial=0.0)) + tail_min
        L = max(L, bound)
        head = np.where(used, first, 0.0)
        tail = np.where(used, L - last, -np.inf)
        tail = np.where(used, np.maximum(tail, 0.0), tail)
        return _Cost(L=float(L), head=head, work=work, tail=tail, wire=int(wire), ops=ops,
                     coupling=self.COUPLING[strategy] if N > 1 else 0.0)

    def _wpn(self) -> int:
        return max(1, int(np.bincount(self.node).max()))

    # -- strategies ----------------------------------------------------------------------------------------
    def _single(self, acc: "_Acc", n: int, K: int, option: Option) -> tuple[float, int]:
        codec = option.codec
        if option.strategy == "ps" and not self.two_way:
            codec = self._none
        per = self._enc(codec, n) + self._dec(codec, n) + self.profile.merge_s(n, 1 if option.strategy != "ring" else 1)
        total = self.o + K * per
        acc.use(0, np.array([0]), 0.0, total, total)
        return total, 0

    def _ring(self, acc: "_Acc", n: int, K: int, codec: Codec) -> tuple[float, int]:
        N, o, prof = self.N, self.o, self.profile
        E, D, M2 = self._enc(codec, n), self._dec(codec, n), prof.merge_s(n, 2)
        B = codec.compressed_nbytes(n)
        ring = np.arange(N)
        X, lat = self._links(ring, (ring + 1) % N, B)
        hop_w = X + lat
        s = np.arange(K) % N
        wk = (s[:, None] + np.arange(N)[None, :]) % N          # (K, N): worker at chain position r
        hop = hop_w[wk]                                         # link from position r to r+1 (r=N-1: to pos 0)
        C0, Cmid = o + E, o + D + M2 + E
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
        return L, K * 2 * (N - 1) * B

    def _ps(self, acc: "_Acc", n: int, K: int, codec: Codec) -> tuple[float, int]:
        N, o, prof = self.N, self.o, self.profile
        pull = codec if self.two_way else self._none
        E, D = self._enc(codec, n), self._dec(codec, n)
        Ep, Dp = self._enc(pull, n), self._dec(pull, n)
        M = prof.merge_s(n, N)
        B, Bp = codec.compressed_nbytes(n), pull.compressed_nbytes(n)
        w = np.arange(N)
        hosts = np.unique(np.arange(K) % N)
        m = -(-K // N)  # partitions per host (at most)
        # one transfer's seconds and latency, taken as the slowest link (cross-node when there is one)
        Xa, lat_a = self._links(w, (w + 1) % N, B)
        Ya, _ = self._links(w, (w + 1) % N, Bp)
        X, Y, lat = float(Xa.max()), float(Ya.max()), float(lat_a.max())
        s_push, s_total = _slots("ps", N, K)
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
        # NIC: busy seconds (gaps the list scheduling leaves inside one exchange are in L; across
        # buckets, other transfers fill them)
        acc.use(1, w, ready, push_end, pushes * X)
        acc.use(1, hosts, T, pull_end, hosted[hosts] * (N - 1) * Y)
        acc.use(2, hosts, ready, push_end, hosted[hosts] * (N - 1) * X)
        acc.use(2, w, T, pull_end, (K - hosted) * Y)
        return L, K * (N - 1) * (B + Bp)

    def _allgather(self, acc: "_Acc", n: int, K: int, codec: Codec) -> tuple[float, int]:
        N, o, prof = self.N, self.o, self.profile
        E, D, M = self._enc(codec, n), self._dec(codec, n), prof.merge_s(n, N)
        B = codec.compressed_nbytes(n)
        w = np.arange(N)
        Xa, lat_a = self._links(w, (w + 1) % N, B)
        X, lat = float(Xa.max()), float(lat_a.max())
        s = _slots("ag", N, K)[1]
        ready = o + E
        net_end = ready + s * X
        compute = 2 * o + K * (E + N * D + M)
        L = max(net_end + lat + D + M + o, compute + X + lat)
        acc.use(0, w, 0.0, L, compute)
        acc.use(1, w, ready, net_end, K * (N - 1) * X)
        acc.use(2, w, ready, net_end, K * (N - 1) * X)
        return L, K * N * (N - 1) * B


_SLOTS: dict[tuple[str, int, int], tuple[int, int]] = {}


def _slots(pattern: str, N: int, K: int) -> tuple[int, int]:
    """Transfer slots the simulator's list scheduling needs for an all-gather (``"ag"``) or a PS
    push-then-pull (``"ps"``) exchange of ``K`` partitions among ``N`` workers: ``(first phase, total)``.

    Transfers take one unit each and start, in (ready, node id) order, when both the sender's egress and
    the receiver's ingress are free — no backfilling, as in :func:`casync.simulator.simulate` — so
    all-to-all exchanges need about 2N-3 slots where a perfect matching would need N-1.  A PS pull
    becomes ready when the last push of its partition arrived.  Memoized per (pattern, N, K).
    """
    key = (pattern, N, K)
    if key in _SLOTS:
        return _SLOTS[key]
    heap: list[tuple[int, str, int, int, int, int]] = []
    for p in range(K):
        h = p % N
        for w in range(N):
            if pattern == "ag":
                heap += [(0, f"p{p}/worker:{w}/to.worker:{v}", w, v, p, 1) for v in range(N) if v != w]
            elif w != h:
                heap.append((0, f"p{p}/worker:{w}/push.to.worker:{h}", w, h, p, 0))
    heapq.heapify(heap)
    egress, ingress = [0] * N, [0] * N
    left, done = [N - 1] * K, [0] * K
    first = end = 0
    while heap:
        ready, _, src, dst, p, phase = heapq.heappop(heap)
        t = max(ready, egress[src], ingress[dst]) + 1
        egress[src] = ingress[dst] = t
        end = max(end, t)
        if phase == 0:
            first = max(first, t)
            left[p] -= 1
            done[p] = max(done[p], t)
            if not left[p]:
                h = p % N
                for w in range(N):
                    if w != h:
                        heapq.heappush(heap, (done[p], f"p{p}/worker:{h}/pull.to.worker:{w}", h, w, p, 1))
    _SLOTS[key] = out = (first if pattern == "ps" else end, end)
    return out


class _Acc:
    """Per-resource accumulation of (first start, last end, busy seconds) for one bucket option."""

    def __init__(self, N: int):
        self.first = [np.full(N, np.inf) for _ in range(3)]
        self.last = [np.full(N, -np.inf) for _ in range(3)]
        self.work = [np.zeros(N) for _ in range(3)]

    def use(self, kind: int, workers: Any, start: Any, end: Any, busy: Any) -> None:
        workers = np.asarray(workers)
        shape = workers.shape
        start = np.broadcast_to(np.asarray(start, dtype=float), shape).ravel()
        end = np.broadcast_to(np.asarray(end, dtype=float), shape).ravel()
        busy = np.broadcast_to(np.asarray(busy, dtype=float), shape).ravel()
        idx = workers.ravel()
        np.minimum.at(self.first[kind], idx, start)
        np.maximum.at(self.last[kind], idx, end)
        np.add.at(self.work[kind], idx, busy)


def _advance(free: np.ndarray, r: float, c: _Cost, N: int) -> np.ndarray:
    """Resource free times after bucket ``c`` (ready at ``r``) claims its work (``free``: (..., R))."""
    f = np.maximum(free, r + c.head) + c.work
    if c.coupling and N > 1:
        e, i = slice(N, 2 * N), slice(2 * N, 3 * N)
        we, wi = c.work[e], c.work[i]
        nic = np.maximum(np.maximum(free[..., e], free[..., i]), r + np.minimum(c.head[e], c.head[i]))
        used = (we + wi) > 0
        f[..., e] = np.where(used, nic + we + c.coupling * wi, f[..., e])
        f[..., i] = np.where(used, nic + wi + c.coupling * we, f[..., i])
    return f


def timeline_estimate(costs: Sequence[_Cost], ready: Sequence[float], order: Sequence[int],
                      workers: int, mode: int = 1) -> tuple[float, list[float]]:
    """Estimated iteration time of buckets with ``costs`` (ready at ``ready``), visited in ``order``."""
    R = costs[0].work.shape[0]
    free = np.zeros(R)
    mt = np.full(R, -np.inf)
    end = 0.0
    fins = [0.0] * len(costs)
    for b in order:
        c, r = costs[b], ready[b]
        backlog = free > r + c.head
        f = _advance(free, r, c, workers)
        if mode == 2:
            used = c.work > 0
            delay = float(np.max(np.where(used, free - r - c.head, 0.0), initial=0.0))
            mt = np.where(c.work > 0, np.where(backlog, np.minimum(mt, c.tail), c.tail), mt)
            mt = np.where(f > r, mt, -np.inf)
            fin = max(r + c.L + max(delay, 0.0), float((f + np.where(c.work > 0, mt, -np.inf)).max()))
        elif mode == 1:
            mt = np.where(c.work > 0, np.where(backlog, np.minimum(mt, c.tail), c.tail), mt)
            mt = np.where(f > r, mt, -np.inf)
            fin = max(r + c.L, float((f + np.where(c.work > 0, mt, -np.inf)).max()))
        else:
            fin = max(r + c.L, float((f + c.tail).max()))
        free = f
        fins[b] = fin
        end = max(end, fin)
    return end, fins
