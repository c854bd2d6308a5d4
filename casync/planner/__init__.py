"""Automatic per-bucket planning: compress or not, which codec, which strategy, how many partitions.

``build_plan(..., strategy="auto", codec="auto", partitions="auto", cluster=ClusterModel(...))`` lands here
(:func:`choose_plan`).  The algorithm follows Espresso (ByteComp) and HiPress:

1. **Candidates.**  Every bucket may use any candidate strategy (``ring``, co-located two-way ``ps``,
   ``allgather``), any candidate codec (default ``none``, ``fp16``, ``onebit``, ``topk:ratio=0.01``) and,
   with ``partitions="auto"``, a few partition counts per strategy (1, 2, 4, N/2, N, 2N and the strategy
   default for ring and PS; 1, 2, 4 for all-gather), never cutting parts below ``MIN_PARTITION_NUMEL``
   elements (HiPress's partitioning rule: a part must be large enough to amortise a transfer).
2. **Fast estimator.**  Each (bucket size, option) gets analytical stage costs from the :class:`Profile`
   and the :class:`ClusterModel`, memoized: per worker, the seconds its compute lane, NIC egress and NIC
   ingress are busy (``alpha + bytes/beta`` per transfer, encode/decode/merge per element, per-task call
   overhead), when that use starts and how long the bucket still runs after it ends, and the bucket's
   isolated makespan (the hop-latency chain of one partition, the transfer slots an all-to-all exchange
   needs under the simulator's list scheduling, pipelining of several partitions).  A pipelined
   timeline over the buckets in ready order — a compute and a network resource per worker, as in
   Espresso's timeline model — combines them into an estimated iteration time, and evaluates all options
   of one bucket at once (NumPy, batched): a few microseconds per bucket and option.
3. **Greedy choice (Espresso).**  Starting from the best uncompressed plan, buckets are visited in priority
   order — largest first, later-ready first among equals; a bucket whose synchronization already hides in
   a bubble (done before the next gradient is ready) is skipped; otherwise it takes the option that lowers
   the estimated iteration time most.  Passes repeat until nothing improves.  The same greedy also starts
   from the best few uniform plans (one option for every bucket).  Then HiPress's selective compression:
   a bucket is compressed only where that saves at least :func:`min_gain` (0.2% of the iteration).
4. **Validation.**  The candidates and the promising fixed uniform plans (one strategy and codec for all
   buckets, default partitions) are run through the real simulator within an op budget
   (``sim_budget_ops``); the best simulated plan is kept, so ``auto`` is never worse in simulation than a
   fixed choice it simulated.  Candidates are not assembled: each distinct (bucket size, option) is
   expanded once into an :class:`~casync.optable.OpTable` fragment and a candidate's table is glued from
   fragments, which simulates exactly as its assembled plan would; only the chosen plan is assembled.
   Small plans (a few thousand ops) are then refined bucket by bucket with the real simulator, and
   compression that does not pay there is undone.

Each bucket's ``note`` says why it got its option, e.g. ``"onebit: -12.3 ms vs none"`` (the estimated
iteration time saved against the best uncompressed option for that bucket, other buckets unchanged),
``"hidden in bubble (40.1 ms to spare)"``, ``"small: kept uncompressed"`` or ``"none: compressing adds
2.0 ms"``.  ``plan.options["planner"]`` records the estimated and simulated iteration time, which
candidate won (``"planner"``, ``"uniform ring/onebit"``, ... ``"(refined with the simulator)"``), how
many simulations ran and how long planning took.

:func:`backward_ready_times` gives a plausible backward-pass profile for ``ready_times``.
"""
from __future__ import annotations

import contextlib
import gc
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from primitives.codecs import Codec, get_codec
from strategies import get_strategy

from ..plan import build as _build
from ..plan.specs import TensorSpec
from ..plan.syncplan import SyncPlan
from ..plan.tensors import tensor_specs
from ..sim.costmodel import ClusterModel, Profile
from ..sim.optable import OpTable

DEFAULT_STRATEGIES: tuple[str, ...] = ("ring", "ps", "allgather")
DEFAULT_CODECS: tuple[str, ...] = ("none", "fp16", "onebit", "topk:ratio=0.01")
#: Real-simulator budget of a planning call, in plan ops simulated (about 4 us each on the 2-core development
#: machine, fragments and gluing included).
DEFAULT_SIM_BUDGET_OPS = 100_000
#: Plans up to this many ops are refined bucket by bucket with the real simulator (budget permitting).
REFINE_MAX_OPS = 4_000
#: Buckets up to this size whose compression never pays in isolation are reported as "small".
SMALL_BYTES = 1 << 20
#: Planner candidates are validated when estimated within this factor of the best so far, or when this cheap.
VALIDATE_MARGIN = 1.3
#: Fixed uniform plans are simulated unless estimated this much slower than the best so far: "auto" must not
#: lose to a fixed choice, and the estimator can be 50% pessimistic (e.g. PS with a 1-bit codec).
UNIFORM_VALIDATE_MARGIN = 2.0
CHEAP_OPS = 5_000
#: The best-estimated fixed uniform plans that are always simulated, beyond the budget if need be; the others
#: are rechecked with estimates corrected by what simulation showed for their strategy.  (With only one, auto
#: lost to a fixed plan by up to 20% in 3 of 48 what-if cells: the recheck alone is not enough.)
MUST_SIMULATE_FIXED = 3
#: A fixed plan not yet simulated is simulated when its estimate, corrected by the simulated/estimated ratio
#: of the simulated plans using its strategy, is within this fraction of the best simulated time.
FIXED_RECHECK_SLACK = 0.05
#: Options per bucket tried with the real simulator when refining (best estimated first).
REFINE_OPTIONS = 8
_TOL = 1e-9  # seconds: smaller estimated differences are ties
#: Compression (lossy) must save at least this much iteration time to be chosen over no compression.
MIN_GAIN_S = 50e-6
MIN_GAIN_FRAC = 0.002


def min_gain(iteration_s: float) -> float:
    """Least predicted saving that justifies compressing a bucket: 0.2% of the iteration, at least 50 us."""
    return max(MIN_GAIN_S, MIN_GAIN_FRAC * iteration_s)


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

    #: How much of a worker's ingress work delays its egress (and back) when transfers go all-to-all: a
    #: send needs its sender's egress and its receiver's ingress at once and the simulator never
    #: backfills.  Where strategies tag all-to-all sends with shifted rounds (every worker sends to the one
    #: k places ahead at round k) the exchange is a perfect matching and the lanes do not wait for each
    #: other; without them an all-gather needs 2N-3 transfer slots for N-1 sends, and 0.5 fitted the
    #: simulator on resnet50/bert-base/gpt2 plans.  Ring transfers pair worker w's egress with w+1's
    #: ingress only, so their lanes never wait for each other.
    COUPLING_UNSHIFTED = {"ring": 0.0, "ps": 0.5, "allgather": 0.5}
    #: PS with several partitions: each host's pushes in and pulls out contend with its own pushes out.
    COUPLING_PS_SERVING = 0.5

    def __init__(self, workers: int, cluster: ClusterModel, profile: Profile, *, error_feedback: bool = True,
                 two_way: bool = True):
        self.N = workers
        self.cluster = cluster
        self.profile = profile
        self.error_feedback = error_feedback
        self.two_way = two_way
        self.o = profile.task_cost_s
        self.node = np.array([cluster.node_of(f"worker:{w}") for w in range(workers)])
        self.nodes = int(self.node.max()) + 1 if workers else 1
        self.cores = cluster.host_cores or cluster.cores_per_node
        # which pool of cores each worker's compute competes in: its node's, or the one host's
        self.pool = np.zeros_like(self.node) if cluster.host_cores else self.node
        self.pools = int(self.pool.max()) + 1 if workers else 1
        self.lanes = cluster.compute_lanes
        self.R = 3 * workers + (self.pools if self.cores else 0)
        self._memo: dict[tuple, _Cost] = {}
        self._none = get_codec("none")

    # -- link and op costs -----------------------------------------------------------------------------
    def _links(self, src: np.ndarray, dst: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        """Transfer seconds and extra latency of sends ``src[i] -> dst[i]`` of ``nbytes`` each."""
        same = self.node[src] == self.node[dst]
        local = self.profile.link_s(nbytes, True, self.cluster)
        remote = self.profile.link_s(nbytes, False, self.cluster)
        x = np.where(same, local[0], remote[0])
        lat = np.where(same, local[1], remote[1])
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
        return self._finish(acc, L, wire, _op_count(option.strategy, N, K), option.strategy, K)

    def _finish(self, acc: "_Acc", L: float, wire: int, ops: int, strategy: str, K: int) -> _Cost:
        N = self.N
        work = np.concatenate([acc.work[0] / self.lanes, acc.work[1], acc.work[2]])
        first = np.concatenate(acc.first)
        last = np.concatenate(acc.last)
        used = work > 0
        head_min = float(first[used].min()) if used.any() else 0.0
        tail_min = float((L - last[used]).min()) if used.any() else 0.0
        if self.cores:
            node_work = np.zeros(self.pools)
            np.add.at(node_work, self.pool, acc.work[0] / min(self.cores, self.lanes * max(1, self._wpp())))
            node_first = np.full(self.pools, np.inf)
            node_last = np.full(self.pools, -np.inf)
            np.minimum.at(node_first, self.pool, acc.first[0])
            np.maximum.at(node_last, self.pool, acc.last[0])
            work = np.concatenate([work, node_work])
            first = np.concatenate([first, node_first])
            last = np.concatenate([last, node_last])
            used = work > 0
        # several partitions share lanes: the bucket cannot finish before its busiest resource is done
        bound = head_min + float(work.max(initial=0.0)) + tail_min
        L = max(L, bound)
        head = np.where(used, first, 0.0)
        tail = np.where(used, L - last, -np.inf)
        tail = np.where(used, np.maximum(tail, 0.0), tail)
        if N == 1 or strategy == "ring":
            coupling = 0.0
        elif strategy == "ps" and K > 1:
            coupling = self.COUPLING_PS_SERVING  # every worker both pushes and serves: its lanes interfere
        else:
            coupling = 0.0 if _shifted_rounds() else self.COUPLING_UNSHIFTED[strategy]
        return _Cost(L=float(L), head=head, work=work, tail=tail, wire=int(wire), ops=ops, coupling=coupling)

    def _wpn(self) -> int:
        return max(1, int(np.bincount(self.node).max()))

    def _wpp(self) -> int:
        """Most workers competing in one pool of cores."""
        return max(1, int(np.bincount(self.pool).max()))

    # -- strategies ----------------------------------------------------------------------------------------
    def _single(self, acc: "_Acc", n: int, K: int, option: Option) -> tuple[float, int]:
        codec = option.codec
        if option.strategy == "ps" and not self.two_way:
            codec = self._none
        per = self._enc(codec, n) + self._dec(codec, n) + self.profile.merge_s(n, 1)
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
        # NIC: busy seconds, stretched by how far the exchange falls short of a perfect schedule (the
        # list scheduling's gaps are lost to the next buckets too: lanes are never backfilled)
        ideal = max(int(pushes.max()), (N - 1) * int(hosted.max())) + max((N - 1) * int(hosted.max()),
                                                                          int((K - hosted).max()))
        stretch = max(1.0, s_total / ideal)
        acc.use(1, w, ready, push_end, stretch * pushes * X)
        acc.use(1, hosts, T, pull_end, stretch * hosted[hosts] * (N - 1) * Y)
        acc.use(2, hosts, ready, push_end, stretch * hosted[hosts] * (N - 1) * X)
        acc.use(2, w, T, pull_end, stretch * (K - hosted) * Y)
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
_PROBE: dict[str, bool] = {}


def _probe(what: str) -> bool:
    """How the strategies tag ops for the simulator's tie-breaking, probed once on tiny expansions:
    ``"shifted"``: all-to-all sends carry a ``round`` (a shifted exchange); ``"ps_encode_rounds"``: PS push
    encodes carry their push's round too (a worker encodes its pushes in round order)."""
    if not _PROBE:
        from strategies import GraphBuilder, Unit, ps
        from strategies import allgather as ag

        unit = Unit(tensor="t", partitions=((0, 4), (4, 8), (8, 12)), workers=3, codec=get_codec("none"),
                    error_feedback=False, divisor=3, priority=0)
        g = GraphBuilder()
        ag.expand(g, unit)
        _PROBE["shifted"] = any("round" in a for _, a in g.graph.nodes(data=True))
        g = GraphBuilder()
        ps.expand(g, unit)
        _PROBE["ps_encode_rounds"] = any("round" in a for _, a in g.graph.nodes(data=True) if a["op"] == "encode")
    return _PROBE[what]


def _shifted_rounds() -> bool:
    return _probe("shifted")


def _slots(pattern: str, N: int, K: int) -> tuple[int, int]:
    """Transfer slots the simulator's list scheduling needs for an all-gather (``"ag"``) or a PS
    push-then-pull (``"ps"``) exchange of ``K`` partitions among ``N`` workers: ``(first phase, total)``.

    Transfers take one unit each and start, in the simulator's order (ready time, then the send's
    ``round`` where strategies tag a shifted exchange, then node id), when both the sender's egress and the
    receiver's ingress are free — no backfilling, as in :func:`casync.simulator.simulate`.  Unshifted, an
    all-to-all exchange needs about 2N-3 slots where a perfect matching needs N-1.  A PS pull becomes
    ready when the last push of its partition arrived.  Memoized per (pattern, N, K).
    """
    key = (pattern, N, K)
    if key in _SLOTS:
        return _SLOTS[key]
    shifted = _shifted_rounds()

    def rnd(k: int) -> int:
        return k % N if shifted else 0

    # a worker encodes its partitions one after the other (in node-id order, or round order where push
    # encodes carry rounds), so the sends of its k-th encoded partition become ready a little after those
    # of its (k-1)-th: k orders before round and id
    heap: list[tuple[float, int, str, int, int, int, int]] = []
    order = sorted(range(K), key=lambda p: f"p{p}/")
    by_round = pattern == "ps" and _probe("ps_encode_rounds")
    for w in range(N):
        mine = [p for p in order if pattern == "ag" or p % N != w]
        if by_round:
            mine.sort(key=lambda p: rnd(p % N - w))
        for k, p in enumerate(mine):
            h = p % N
            ready = k * 1e-6
            if pattern == "ag":
                heap += [(ready, rnd(v - w), f"p{p}/worker:{w}/to.worker:{v}", w, v, p, 1) for v in range(N) if v != w]
            else:
                heap.append((ready, rnd(h - w), f"p{p}/worker:{w}/push.to.worker:{h}", w, h, p, 0))
    heapq.heapify(heap)
    egress, ingress = [0.0] * N, [0.0] * N
    left, done = [N - 1] * K, [0.0] * K
    first = end = 0.0
    while heap:
        ready, _, _, src, dst, p, phase = heapq.heappop(heap)
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
                        heapq.heappush(heap, (done[p], rnd(w - h), f"p{p}/worker:{h}/pull.to.worker:{w}",
                                              h, w, p, 1))
    _SLOTS[key] = out = (round(first if pattern == "ps" else end), round(end))
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


# ---------------------------------------------------------------------------------------------------------
# Pipelined timeline over buckets (batched over the options of one bucket)
# ---------------------------------------------------------------------------------------------------------

#: Share of a bucket's queueing delay (work already waiting on the lanes it uses when it becomes ready)
#: that lengthens its own hop chain: ops of all pending buckets interleave in ready order, so a bucket
#: arriving behind a backlog neither waits for all of it nor none of it (fitted against the simulator).
THETA = 0.5


@dataclass
class _Stack:
    """Costs of several options of one bucket as arrays (leading axis: option)."""

    head: np.ndarray
    work: np.ndarray
    tail: np.ndarray
    L: np.ndarray
    coupling: np.ndarray

    @classmethod
    def of(cls, costs: Sequence[_Cost]) -> "_Stack":
        return cls(head=np.stack([c.head for c in costs]), work=np.stack([c.work for c in costs]),
                   tail=np.stack([c.tail for c in costs]), L=np.array([c.L for c in costs]),
                   coupling=np.array([c.coupling for c in costs]))


def _step(free: np.ndarray, mt: np.ndarray, r: float, head: np.ndarray, work: np.ndarray, tail: np.ndarray,
          L: Any, coupling: Any, N: int) -> tuple[np.ndarray, np.ndarray, Any]:
    """One bucket (ready at ``r``) claims its work.  ``free``/``mt``: per resource, when it is free and the
    shortest remaining chain after the work queued on it; arrays may carry a leading option axis.
    Returns the new ``free``, ``mt`` and the bucket's estimated finish."""
    used = work > 0
    start = r + head
    backlog = free > start
    delay = np.max(np.where(used, free - start, 0.0), axis=-1)
    f = np.maximum(free, start) + work
    coupling = np.asarray(coupling, dtype=float)
    if N > 1 and np.any(coupling > 0):
        e, i = slice(N, 2 * N), slice(2 * N, 3 * N)
        we, wi = work[..., e], work[..., i]
        c = coupling[..., None]
        nic = np.maximum(np.maximum(free[..., e], free[..., i]), r + np.minimum(head[..., e], head[..., i]))
        on = ((we + wi) > 0) & (c > 0)
        f[..., e] = np.where(on, nic + we + c * wi, f[..., e])
        f[..., i] = np.where(on, nic + wi + c * we, f[..., i])
    mt = np.where(used, np.where(backlog, np.minimum(mt, tail), tail), mt)
    mt = np.where(f > r, mt, -np.inf)
    fin = np.maximum(r + L + THETA * np.maximum(delay, 0.0), np.max(f + np.where(used, mt, -np.inf), axis=-1))
    return f, mt, fin


class _Timeline:
    """Espresso-style timeline model: buckets claim per-worker compute / egress / ingress in ready order."""

    def __init__(self, ready: Sequence[float], workers: int, resources: int):
        self.ready = list(ready)
        self.N = workers
        self.R = resources
        self.order = sorted(range(len(ready)), key=lambda b: (ready[b], b))
        self.pos = {b: i for i, b in enumerate(self.order)}

    def run(self, costs: Sequence[_Cost]) -> tuple[float, float, list[float], list[tuple]]:
        """(iteration time, sum of finishes, finish per bucket, state before each position)."""
        free, mt = np.zeros(self.R), np.full(self.R, -np.inf)
        end = total = 0.0
        fins = [0.0] * len(costs)
        states = []
        for b in self.order:
            states.append((free, mt, end, total))
            c = costs[b]
            free, mt, fin = _step(free, mt, self.ready[b], c.head, c.work, c.tail, c.L, c.coupling, self.N)
            fins[b] = float(fin)
            end = max(end, fins[b])
            total += fins[b]
        return end, total, fins, states

    def batch(self, states: list[tuple], b: int, stack: _Stack, costs: Sequence[_Cost]) -> tuple[np.ndarray, np.ndarray]:
        """Iteration time and sum of finishes for every option of bucket ``b`` (others as in ``costs``)."""
        i = self.pos[b]
        free, mt, end, total = states[i]
        free, mt, fin = _step(free, mt, self.ready[b], stack.head, stack.work, stack.tail, stack.L,
                              stack.coupling, self.N)
        end = np.maximum(end, fin)
        total = total + fin
        for other in self.order[i + 1:]:
            c = costs[other]
            free, mt, fin = _step(free, mt, self.ready[other], c.head, c.work, c.tail, c.L, c.coupling, self.N)
            end = np.maximum(end, fin)
            total = total + fin
        return end, total


def timeline_estimate(costs: Sequence[_Cost], ready: Sequence[float], workers: int) -> tuple[float, list[float]]:
    """Estimated iteration time and per-bucket finish of buckets with ``costs`` ready at ``ready``."""
    end, _, fins, _ = _Timeline(ready, workers, costs[0].work.shape[0]).run(costs)
    return end, fins


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Lexicographic (iteration time, sum of finishes) with a tolerance: is ``a`` strictly better?"""
    tol = max(_TOL, 1e-6 * abs(b[0]))
    if a[0] < b[0] - tol:
        return True
    if a[0] > b[0] + tol:
        return False
    return a[1] < b[1] - max(_TOL, 1e-6 * abs(b[1]))


# ---------------------------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------------------------

@dataclass
class _Bucket:
    name: str
    group: list[TensorSpec]
    numel: int
    ready: float
    options: list[Option] = field(default_factory=list)
    costs: list[_Cost] = field(default_factory=list)
    stack: _Stack | None = None
    index: dict[tuple[str, str, int], int] = field(default_factory=dict)
    baseline: list[int] = field(default_factory=list)  # options with the baseline (uncompressed) codec


def _partition_candidates(strategy: str, workers: int, numel: int, partitions: Any) -> list[int]:
    default = _build.effective_partitions(_build.BucketChoice(strategy=strategy), workers, numel)
    if partitions is None:
        return [default]
    if partitions != "auto":
        return [int(partitions)]
    cap = max(1, -(-numel // _build.MIN_PARTITION_NUMEL))
    wanted = (1, 2, 4) if strategy == "allgather" else (1, 2, 4, workers // 2, workers, 2 * workers)
    return sorted({default} | {k for k in wanted if 1 <= k <= cap})


def _normalize_strategies(strategies: Any) -> tuple[str, ...]:
    if strategies == "auto" or strategies is None:
        strategies = DEFAULT_STRATEGIES
    elif isinstance(strategies, str):
        strategies = (strategies,)
    elif not isinstance(strategies, (list, tuple)):
        raise TypeError(f"strategies must be 'auto', a strategy name or a list of names, got {strategies!r}")
    elif not strategies:
        raise ValueError("strategy candidates must not be empty")
    out = []
    for s in strategies:
        get_strategy(s)  # validates, naming the choices
        if s not in out:
            out.append(s)
    return tuple(out)


def _normalize_codecs(codecs: Any) -> tuple[Codec, ...]:
    if isinstance(codecs, str) and codecs == "auto":
        codecs = DEFAULT_CODECS
    elif not isinstance(codecs, list):
        codecs = [codecs]
    elif not codecs:
        raise ValueError("codec candidates must not be empty")
    out: list[Codec] = []
    for spec in codecs:
        c = get_codec(spec)
        if c not in out:
            out.append(c)
    return tuple(out)


def _normalize_partitions(partitions: Any) -> Any:
    if partitions is None or partitions == "auto":
        return partitions
    _build._check_int("partitions", partitions, 1)
    if partitions > _build.MAX_PARTITIONS:
        raise ValueError(f"partitions={partitions} is more than the supported maximum {_build.MAX_PARTITIONS}")
    return partitions


def _bucket_ready(groups: list[tuple[str, list[TensorSpec]]], ready_times: Mapping[str, float] | None,
                  specs: list[TensorSpec]) -> list[float]:
    """A bucket is ready when its last member is (as the simulator has it); unknown names are errors."""
    if ready_times is None:
        return [0.0] * len(groups)
    if not isinstance(ready_times, Mapping):
        raise TypeError("ready_times must be a mapping tensor name -> seconds")
    known = {s.name for s in specs} | {name for name, _ in groups}
    unknown = set(ready_times) - known
    if unknown:
        raise ValueError(f"ready_times names unknown tensors: {sorted(unknown)[:5]}")
    for name, t in ready_times.items():
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"ready_times[{name!r}] must be a non-negative number of seconds, got {t!r}")
    out = []
    for name, group in groups:
        times = [ready_times[s.name] for s in group if s.name in ready_times]
        if name in ready_times:
            times.append(ready_times[name])
        out.append(float(max(times)) if times else 0.0)
    return out


class Planner:
    """Chooses one :class:`Option` per bucket; see the module docstring.  Use :func:`choose_plan`."""

    def __init__(self, specs: list[TensorSpec], workers: int, cluster: ClusterModel, profile: Profile, *,
                 strategies: Sequence[str], codecs: Sequence[Codec], partitions: Any, bucket_bytes: int,
                 ready_times: Mapping[str, float] | None, two_way: bool, error_feedback: bool, op: str = "mean"):
        self.specs = specs
        self.workers = workers
        self.cluster = cluster
        self.profile = profile
        self.strategies = tuple(strategies)
        self.codecs = tuple(codecs)
        self.partitions = partitions
        self.two_way = two_way
        self.error_feedback = error_feedback
        self.op = op
        self._fragments: dict[tuple[int, str, str, int], OpTable] = {}
        self.groups = _build.name_buckets(specs, _build.make_buckets(specs, bucket_bytes))
        ready = _bucket_ready(self.groups, ready_times, specs)
        self.est = Estimator(workers, cluster, profile, error_feedback=error_feedback, two_way=two_way)
        none = get_codec("none")
        self.base_codec = none if none in self.codecs else self.codecs[0]
        self.buckets: list[_Bucket] = []
        for (name, group), r in zip(self.groups, ready):
            numel = sum(s.numel for s in group)
            b = _Bucket(name=name, group=group, numel=numel, ready=r)
            for strategy in self.strategies:
                for k in _partition_candidates(strategy, workers, numel, partitions):
                    for codec in self.codecs:
                        b.index[(strategy, str(codec), k)] = len(b.options)
                        if codec == self.base_codec:
                            b.baseline.append(len(b.options))
                        b.options.append(Option(strategy, codec, k))
            b.costs = [self.est.cost(numel, o) for o in b.options]
            b.stack = _Stack.of(b.costs)
            self.buckets.append(b)
        self.timeline = _Timeline([b.ready for b in self.buckets], workers, self.est.R)
        # Espresso's priority: largest first, later-ready first among equals
        self.priority = sorted(range(len(self.buckets)),
                               key=lambda i: (-self.buckets[i].numel, -self.buckets[i].ready, i))

    # -- evaluation ----------------------------------------------------------------------------------------
    def costs_of(self, assign: Sequence[int]) -> list[_Cost]:
        return [b.costs[j] for b, j in zip(self.buckets, assign)]

    def estimate(self, assign: Sequence[int]) -> tuple[float, float]:
        end, total, _, _ = self.timeline.run(self.costs_of(assign))
        return end, total

    def uniform(self, strategy: str, codec: Codec, rule: Any) -> list[int] | None:
        """One option for every bucket: ``rule`` is ``"default"`` or a partition count (clipped per bucket)."""
        assign = []
        for b in self.buckets:
            ks = [k for (s, c, k) in b.index if s == strategy and c == str(codec)]
            if not ks:
                return None
            if rule == "default":
                k = _build.effective_partitions(_build.BucketChoice(strategy=strategy), self.workers, b.numel)
                if (strategy, str(codec), k) not in b.index:
                    k = min(ks, key=lambda x: abs(x - k))
            else:
                k = max([x for x in ks if x <= rule], default=min(ks))
            assign.append(b.index[(strategy, str(codec), k)])
        return assign

    def hidden(self, b: int, fins: list[float]) -> float | None:
        """Seconds bucket ``b`` finishes before the next gradient is ready, if it hides in that bubble."""
        i = self.timeline.pos[b]
        if i + 1 >= len(self.buckets):
            return None
        nxt = self.buckets[self.timeline.order[i + 1]].ready
        slack = nxt - fins[b]
        return slack if slack >= 0 else None

    # -- search ---------------------------------------------------------------------------------------------
    def greedy(self, assign: list[int], *, skip_hidden: bool, passes: int = 4) -> list[int]:
        """Espresso's greedy: visit buckets by priority, keep the option that lowers the estimate most."""
        assign = list(assign)
        for _ in range(passes):
            changed = False
            for b in self.priority:
                costs = self.costs_of(assign)
                end, total, fins, states = self.timeline.run(costs)
                if skip_hidden and self.hidden(b, fins) is not None:
                    continue
                ends, totals = self.timeline.batch(states, b, self.buckets[b].stack, costs)
                best = assign[b]
                for j in np.lexsort((totals, ends))[:1]:
                    if _better((float(ends[j]), float(totals[j])), (end, total)):
                        best = int(j)
                if best != assign[b]:
                    assign[b] = best
                    changed = True
            if not changed:
                break
        return assign

    def simplify(self, assign: list[int]) -> list[int]:
        """Where the baseline codec (no compression) estimates as good, use it: compress only where it pays."""
        assign = list(assign)
        for b in self.priority:
            bucket = self.buckets[b]
            if assign[b] in bucket.baseline:
                continue
            costs = self.costs_of(assign)
            end, total, _, states = self.timeline.run(costs)
            ends, totals = self.timeline.batch(states, b, bucket.stack, costs)
            base = min(bucket.baseline, key=lambda j: (ends[j], totals[j]))
            if ends[base] <= end + min_gain(end):
                assign[b] = int(base)
        return assign

    def notes(self, assign: list[int]) -> list[str]:
        """Why each bucket has its option: the predicted gain against the best baseline-codec option."""
        costs = self.costs_of(assign)
        end, total, fins, states = self.timeline.run(costs)
        out = []
        base_name = str(self.base_codec)
        verb = "compressing" if base_name == "none" else "another codec"
        for b, bucket in enumerate(self.buckets):
            opt = bucket.options[assign[b]]
            ends, _ = self.timeline.batch(states, b, bucket.stack, costs)
            others = [j for j in range(len(bucket.options)) if j not in bucket.baseline]
            slack = self.hidden(b, fins)
            if assign[b] in bucket.baseline:
                if slack is not None:
                    out.append(f"hidden in bubble ({slack * 1e3:.1f} ms to spare)")
                elif not others:
                    out.append(f"{base_name}: the only codec candidate")
                else:
                    best = min(others, key=lambda j: ends[j])
                    extra = float(ends[best]) - end
                    if self._small(bucket):
                        out.append(f"small: kept {'uncompressed' if base_name == 'none' else base_name}")
                    elif extra > 5e-5:
                        out.append(f"{base_name}: {verb} adds {extra * 1e3:.1f} ms")
                    else:
                        out.append(f"{base_name}: {verb} saves nothing")
            else:
                best_base = min(bucket.baseline, key=lambda j: ends[j]) if bucket.baseline else None
                if best_base is None:
                    out.append(f"{opt.codec}: best of the candidates")
                else:
                    gain = float(ends[best_base]) - end
                    note = f"{opt.codec}: {-gain * 1e3:+.1f} ms vs {base_name}"
                    if slack is not None:
                        note += " (hidden in bubble)"
                    out.append(note)
        return out

    def _never_pays(self, bucket: _Bucket) -> bool:
        """HiPress's selective compression: in isolation, no compressed option beats the best uncompressed."""
        base = min(bucket.costs[j].L for j in bucket.baseline)
        comp = [c.L for j, c in enumerate(bucket.costs) if j not in bucket.baseline]
        return bool(comp) and min(comp) >= base

    def _small(self, bucket: _Bucket) -> bool:
        return bucket.numel * 4 <= SMALL_BYTES and self._never_pays(bucket)

    def table(self, assign: Sequence[int]) -> OpTable:
        """The simulator's op table of the plan ``assign`` stands for, glued from per-bucket fragments: each
        distinct (bucket size, option) is expanded once per planning call, however many candidates use it."""
        return OpTable.concat([(self._fragment(b, j), b.name, index)
                               for index, (b, j) in enumerate(zip(self.buckets, assign))])

    def _fragment(self, bucket: _Bucket, j: int) -> OpTable:
        o = bucket.options[j]
        key = (bucket.numel, o.strategy, str(o.codec), o.partitions)
        frag = self._fragments.get(key)
        if frag is None:
            choice = _build.BucketChoice(strategy=o.strategy, codec=o.codec, partitions=o.partitions,
                                         two_way=self.two_way, servers=None)
            plan = _build.assemble_plan(bucket.group, self.workers, [(bucket.name, bucket.group)], [choice],
                                        error_feedback=self.error_feedback, op=self.op)
            frag = self._fragments[key] = OpTable.from_graph(plan.graph)
            frag.durations(self.profile)
        return frag

    def choices(self, assign: list[int], notes: list[str]) -> list[_build.BucketChoice]:
        return [_build.BucketChoice(strategy=o.strategy, codec=o.codec, partitions=o.partitions,
                                    two_way=self.two_way, servers=None, note=note)
                for o, note in zip((b.options[j] for b, j in zip(self.buckets, assign)), notes)]


def choose_plan(tensors: Any, workers: int = 4, cluster: ClusterModel | None = None, profile: Profile | None = None,
                strategies: Any = DEFAULT_STRATEGIES, codecs: Any = "auto", partitions: Any = "auto",
                ready_times: Mapping[str, float] | None = None, *, two_way: bool = True,
                error_feedback: bool = True, op: str = "mean", bucket_bytes: int | None = None, seed: int = 0,
                sim_budget_ops: int = DEFAULT_SIM_BUDGET_OPS, options: Mapping[str, Any] | None = None) -> SyncPlan:
    """Choose strategy, codec and partitions per bucket for ``workers`` on ``cluster``; returns the plan.

    ``strategies``: ``"auto"`` (ring, ps, allgather) or names; ``codecs``: ``"auto"`` (none, fp16, onebit,
    topk:ratio=0.01), a list of specs, or one spec; ``partitions``: ``"auto"`` (a few per strategy), ``None``
    (each strategy's default) or an int.  ``cluster`` defaults to what :func:`~casync.simulator.simulate`
    assumes (all workers on one node); ``profile`` to :meth:`Profile.default`; ``ready_times`` maps tensor
    names to the second their gradient is ready (see :func:`backward_ready_times`).  ``sim_budget_ops``
    bounds the real-simulator checks (plan ops simulated); 0 trusts the estimator alone.

    Every bucket's ``note`` says why it got its option; ``plan.options["planner"]`` holds the estimated
    and simulated iteration times and which candidate plan won.
    """
    with _gc_paused():
        return _choose_plan(tensors, workers, cluster, profile, strategies, codecs, partitions, ready_times,
                            two_way=two_way, error_feedback=error_feedback, op=op, bucket_bytes=bucket_bytes,
                            seed=seed, sim_budget_ops=sim_budget_ops, options=options)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while planning: candidate plans allocate hundreds of thousands of small,
    acyclic objects, and the collector's passes over them took a quarter of the planning time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _choose_plan(tensors: Any, workers: int, cluster: ClusterModel | None, profile: Profile | None, strategies: Any,
                 codecs: Any, partitions: Any, ready_times: Mapping[str, float] | None, *, two_way: bool,
                 error_feedback: bool, op: str, bucket_bytes: int | None, seed: int, sim_budget_ops: int,
                 options: Mapping[str, Any] | None) -> SyncPlan:
    from ..sim.simulator import run_table

    started = time.perf_counter()
    _build._check_int("workers", workers, 1)
    _build._check_bool("two_way", two_way)
    _build._check_bool("error_feedback", error_feedback)
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
    _build._check_int("bucket_bytes", bucket_bytes, 0, allow_none=True)
    _build._check_int("seed", seed, 0)
    _build._check_int("sim_budget_ops", sim_budget_ops, 0)
    strategies = _normalize_strategies(strategies)
    codec_objs = _normalize_codecs(codecs)
    partitions = _normalize_partitions(partitions)
    cluster = cluster if cluster is not None else ClusterModel(nodes=1, workers_per_node=workers)
    if not isinstance(cluster, ClusterModel):
        raise TypeError(f"cluster must be a casync.ClusterModel, got {type(cluster).__name__}")
    if cluster.nodes * cluster.workers_per_node < workers:
        raise ValueError(f"cluster has room for {cluster.nodes * cluster.workers_per_node} workers "
                         f"(nodes x workers_per_node), plan has {workers}")
    profile = profile if profile is not None else Profile.default()
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a casync.costmodel.Profile, got {type(profile).__name__}")
    for c in codec_objs:
        try:
            profile.encode_s(str(c), 1)
            profile.decode_s(str(c), 1)
        except KeyError as exc:
            raise ValueError(f"cannot plan with codec {str(c)!r}: {exc.args[0]}") from None
    specs = tensor_specs(tensors)
    bucket_bytes = _build.DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    planner = Planner(specs, workers, cluster, profile, strategies=strategies, codecs=codec_objs,
                      partitions=partitions, bucket_bytes=bucket_bytes, ready_times=ready_times,
                      two_way=two_way, error_feedback=error_feedback, op=op)

    # 1. starting points: uniform plans (every strategy x codec x partition rule), estimated
    rules: list[Any] = ["default"]
    if partitions == "auto":
        rules += sorted({k for b in planner.buckets for o in b.options for k in [o.partitions]})
    uniform: dict[tuple[str, str, Any], list[int]] = {}
    for s in strategies:
        for c in codec_objs:
            for rule in rules:
                a = planner.uniform(s, c, rule)
                if a is not None and tuple(a) not in {tuple(v) for v in uniform.values()}:
                    uniform[(s, str(c), rule)] = a
    scored = sorted(uniform.items(), key=lambda kv: planner.estimate(kv[1]))
    # 2. Espresso: from the best plan without compression, bucket by bucket, skipping hidden ones
    base_plans = [a for (s, c, r), a in scored if c == str(planner.base_codec)]
    candidates = [planner.greedy(base_plans[0], skip_hidden=True)]
    # ... and from the best few uniform plans
    for _, a in scored[:3]:
        candidates.append(planner.greedy(a, skip_hidden=False))
    # compress only where it pays (by the estimate); the unsimplified results are validated too
    twins = {tuple(a): planner.simplify(a) for a in candidates}
    best = min(twins.values(), key=planner.estimate)
    best_est = planner.estimate(best)[0]

    # 3. validate with the real simulator, within the op budget: the planner's candidates and the fixed
    # uniform plans (default partitions) that the estimate does not rule out (cheap ones always)
    bucket_ready = {b.name: b.ready for b in planner.buckets}
    budget = sim_budget_ops
    sims = 0

    # whatever the budget, the planner's pick and the best-estimated fixed plans are simulated: "auto" must
    # not lose to a fixed choice in simulation, and at scale the estimator alone can be far off
    defaults = sorted((a for (s, c, rule), a in uniform.items() if rule == "default"), key=planner.estimate)
    must = {tuple(best)} | {tuple(a) for a in defaults[:MUST_SIMULATE_FIXED]}

    def run(assign: list[int]) -> float | None:
        """Simulated iteration time of ``assign`` (exactly what simulate() gives on its assembled plan)."""
        nonlocal budget, sims
        ops = sum(b.costs[j].ops for b, j in zip(planner.buckets, assign))
        if ops > budget and tuple(assign) not in must:
            return None
        budget -= ops
        sims += 1
        return run_table(planner.table(assign), cluster, profile, bucket_ready, records=False).iteration_time

    queue: list[tuple[float, int, str, list[int]]] = []
    for raw, simple in twins.items():
        queue.append((planner.estimate(simple)[0], 0 if simple == best else 2, "planner", simple))
        queue.append((planner.estimate(list(raw))[0], 2, "planner", list(raw)))
    for (s, c, rule), a in uniform.items():
        if rule == "default":
            queue.append((planner.estimate(a)[0], 1, f"uniform {s}/{c}", a))
    queue.sort(key=lambda x: (min(x[1], 1), x[0]))
    simulated: list[tuple[float, str, list[int]]] = []
    seen: set[tuple[int, ...]] = set()
    for est, _, label, a in queue:
        if tuple(a) in seen:
            continue
        seen.add(tuple(a))
        ref = min(x[0] for x in simulated) if simulated else best_est
        cheap = sum(b.costs[j].ops for b, j in zip(planner.buckets, a)) <= CHEAP_OPS
        margin = UNIFORM_VALIDATE_MARGIN if label.startswith("uniform") else VALIDATE_MARGIN
        if est > margin * ref and not cheap and tuple(a) not in must:
            continue
        t = run(a)
        if t is not None:
            simulated.append((t, label, a))
    # the estimator's error is mostly per strategy (e.g. 50% pessimistic for PS with a 1-bit codec): correct
    # the estimates of the fixed plans not simulated by what simulation showed for their strategy, and
    # simulate, whatever the budget, every one that could still beat the best simulated plan
    fixed = {tuple(a): (s, a) for (s, c, rule), a in uniform.items() if rule == "default"}
    tried = {tuple(a) for _, _, a in simulated}
    rechecked = 0
    while simulated:
        ratios: dict[str, list[float]] = {}  # strategy -> simulated / estimated of the plans using it
        for t, label, a in simulated:
            ratio = t / max(planner.estimate(a)[0], 1e-12)
            for strategy in {b.options[j].strategy for b, j in zip(planner.buckets, a)}:
                ratios.setdefault(strategy, []).append(ratio)
        if not ratios:
            break
        # a strategy no simulated plan used gets the benefit of the doubt: as pessimistic as the margin allows
        unknown = min(min(r) for r in ratios.values()) / UNIFORM_VALIDATE_MARGIN
        best_t = min(x[0] for x in simulated)
        pending = sorted((planner.estimate(a)[0] * min(ratios.get(s, [unknown])), a) for key, (s, a) in fixed.items()
                         if key not in tried)
        if not pending or pending[0][0] > (1 + FIXED_RECHECK_SLACK) * best_t:
            break
        _, a = pending[0]
        tried.add(tuple(a))
        must.add(tuple(a))
        rechecked += 1
        t = run(a)
        if t is not None:
            label = next(f"uniform {s}/{c}" for (s, c, rule), u in uniform.items() if rule == "default" and u == a)
            simulated.append((t, label, a))
    if simulated:
        sim_time, winner, best = min(simulated, key=lambda x: x[0])
        # an unsimplified result wins only if its extra compression saves min_gain in simulation too
        times = {tuple(a): t for t, _, a in simulated}
        simple = twins.get(tuple(best))
        if simple is not None and tuple(simple) in times and simple != best:
            t_simple = times[tuple(simple)]
            if t_simple <= sim_time + min_gain(sim_time) and t_simple <= min(
                    [t for t, label, _ in simulated if label.startswith("uniform")], default=math.inf):
                sim_time, best = t_simple, simple
    else:
        sim_time, winner = None, "planner"

    # 4. small plans: refine bucket by bucket with the real simulator (most promising options first);
    # compressing a bucket that was not must save min_gain; then undo compression that does not pay
    ops_now = sum(b.costs[j].ops for b, j in zip(planner.buckets, best))
    if sim_time is not None and ops_now <= REFINE_MAX_OPS:
        fixed_best = min([t for t, label, _ in simulated if label.startswith("uniform")], default=math.inf)
        reserve = budget * 0.3  # for undoing compression that does not pay, below
        budget -= reserve
        improved, exhausted = True, False
        while improved and not exhausted:
            improved = False
            for b in planner.priority:
                bucket = planner.buckets[b]
                costs = planner.costs_of(best)
                _, _, _, states = planner.timeline.run(costs)
                ends, totals = planner.timeline.batch(states, b, bucket.stack, costs)
                for j in np.lexsort((totals, ends))[:REFINE_OPTIONS]:
                    if j == best[b]:
                        continue
                    trial = list(best)
                    trial[b] = int(j)
                    t = run(trial)
                    if t is None:
                        exhausted = True
                        break
                    compress = best[b] in bucket.baseline and j not in bucket.baseline
                    if t < sim_time - (min_gain(sim_time) if compress else 1e-6 * sim_time):
                        sim_time, best, improved = t, trial, True
                        if "refined" not in winner:
                            winner += " (refined with the simulator)"
                if exhausted:
                    break
        budget += reserve
        exhausted = False
        anchor = sim_time
        cap = min(anchor + min_gain(anchor), fixed_best)
        for b in planner.priority[::-1]:
            bucket = planner.buckets[b]
            if best[b] in bucket.baseline or exhausted:
                continue
            costs = planner.costs_of(best)
            _, _, _, states = planner.timeline.run(costs)
            ends, totals = planner.timeline.batch(states, b, bucket.stack, costs)
            opt = bucket.options[best[b]]
            same = bucket.index.get((opt.strategy, str(planner.base_codec), opt.partitions))
            tries = [same] if same is not None else []
            tries.append(int(min(bucket.baseline, key=lambda j: (ends[j], totals[j]))))
            for j in dict.fromkeys(tries):
                trial = list(best)
                trial[b] = j
                t = run(trial)
                if t is None:
                    exhausted = True
                    break
                if t <= cap:
                    sim_time, best = t, trial
                    break

    # 5. the plan, with a note per bucket and what the planner did in plan.options["planner"]
    candidates = [dict(plan=label, estimated_s=planner.estimate(a)[0], simulated_s=t)
                  for t, label, a in sorted(simulated, key=lambda x: x[0])]
    notes = planner.notes(best)
    if winner.startswith("uniform") and any(label == winner and a == best for _, label, a in simulated):
        # a fixed choice won in simulation: the per-bucket estimates alone would not have picked it, say so
        mix = min((t for t, label, _ in simulated if label == "planner"), default=None)
        why = (f"{winner.split(' ', 1)[1]} for every bucket simulated fastest ({sim_time * 1e3:.1f} ms"
               + (f"; per-bucket mix {mix * 1e3:.1f} ms)" if mix is not None else ")"))
        notes = [f"{note} by estimate; {why}" for note in notes]
    plan = _build.assemble_plan(specs, workers, planner.groups, planner.choices(best, notes),
                                error_feedback=error_feedback, op=op)
    for bucket, note in zip(plan.buckets, notes):
        bucket.note = note
    plan.options.update(options or {})
    plan.options.setdefault("strategy", "auto")
    plan.options.setdefault("codec", "auto")
    plan.options.setdefault("partitions", partitions)
    plan.options.update(two_way=two_way, bucket_bytes=bucket_bytes, seed=seed, servers=None, planner=dict(
        estimated_s=planner.estimate(best)[0], simulated_s=sim_time, chosen=winner, simulations=sims,
        rechecked_fixed=rechecked, candidates=candidates,
        strategies=list(strategies), codecs=[str(c) for c in codec_objs], partitions=partitions,
        cluster=cluster.to_dict(), seconds=time.perf_counter() - started))
    return plan
