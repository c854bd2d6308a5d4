"""The planner's fast estimator: a bucket option's isolated cost per resource, from the strategy's own model.

For each (bucket size, option) the estimator asks the option's strategy (``Strategy.estimate``) for its
makespan and how long it occupies each worker's compute lane, NIC egress and NIC ingress; a strategy
without an analytical model is simulated alone instead (exact, slower).  The costs then feed the
Espresso-style timeline (:mod:`casync.planner.timeline`).  Resources are indexed
``[compute(N) | egress(N) | ingress(N) | shared cores (if modelled)]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from casync.primitives import feedback
from casync.primitives.codecs import Codec
from casync.primitives.ir import Actor
from casync.primitives.merge import merges_in_encode
from casync.strategies import IDENTITY, get_strategy

from ..sim.costmodel import ClusterModel, Profile
from ..sim.optable import merged_inputs
from .slots import slots


@dataclass(frozen=True)
class Option:
    """One way to synchronize a bucket: strategy, codec and partition count."""

    strategy: str
    codec: Codec
    partitions: int

    def label(self) -> str:
        return f"{self.codec} {self.strategy}x{self.partitions}"


@dataclass
class Cost:
    """Estimated isolated behaviour of one bucket option (resources: compute, egress, ingress per worker)."""

    L: float                # isolated makespan, from ready to the last op's end
    head: np.ndarray        # per resource: when its first use starts (offset from ready)
    work: np.ndarray        # per resource: seconds busy
    tail: np.ndarray        # per resource: L - end of its last use (-inf where unused)
    wire: int               # bytes all sends put on the wire
    ops: int                # plan nodes
    coupling: float = 0.0   # all-to-all traffic: a worker's egress and ingress wait for each other


class Usage:
    """Per-resource accumulation of (first start, last end, busy seconds) for one bucket option."""

    def __init__(self, N: int):
        self.first = [np.full(N, np.inf) for _ in range(3)]
        self.last = [np.full(N, -np.inf) for _ in range(3)]
        self.work = [np.zeros(N) for _ in range(3)]
        self.threads = np.zeros(N)  # seconds of the data plane's threads (calibrated profiles), off the lanes

    def use(self, kind: int, workers: Any, start: Any, end: Any, busy: Any) -> None:
        """Resource ``kind`` (0 compute, 1 egress, 2 ingress) of ``workers`` busy ``busy`` s in [start, end]."""
        workers = np.asarray(workers)
        shape = workers.shape
        start = np.broadcast_to(np.asarray(start, dtype=float), shape).ravel()
        end = np.broadcast_to(np.asarray(end, dtype=float), shape).ravel()
        busy = np.broadcast_to(np.asarray(busy, dtype=float), shape).ravel()
        idx = workers.ravel()
        np.minimum.at(self.first[kind], idx, start)
        np.maximum.at(self.last[kind], idx, end)
        np.add.at(self.work[kind], idx, busy)

    def sent(self, est: "Estimator", workers: Any, count: Any, nbytes: int) -> None:
        """``workers`` each send ``count`` messages of ``nbytes`` to their exchange's peers: their threads' CPU (a
        calibrated direct plane's ``Profile.message_cpu_s``) takes the cores of the worker's node.  The simulator
        splits a message between nodes across both ends; in these symmetric exchanges each node's total comes out
        the same.  Peers are taken as the other workers: a message goes between nodes with the share of them that
        are on other nodes (:meth:`Estimator.remote_share`)."""
        remote = est.remote_share
        cost = ((1 - remote) * est.profile.message_cpu_s(nbytes, True) if remote < 1 else 0.0) + (
            remote * est.profile.message_cpu_s(nbytes, False) if remote > 0 else 0.0)
        if cost:
            workers = np.asarray(workers)
            np.add.at(self.threads, workers.ravel(), np.broadcast_to(np.asarray(count, float) * cost,
                                                                     workers.shape).ravel())


class Estimator:
    """Fast analytical stand-in for :func:`casync.sim.simulator.simulate` over per-bucket options."""

    def __init__(self, workers: int, cluster: ClusterModel, profile: Profile, *, error_feedback: bool | str = "auto",
                 two_way: bool = True, op: str = "mean"):
        self.N = workers
        self.cluster = cluster
        self.profile = profile
        self.error_feedback = error_feedback
        self.two_way = two_way
        self.op = op
        self.o = profile.task_cost_s
        self.node = np.array([cluster.node_of(f"worker:{w}") for w in range(workers)])
        self.nodes = int(self.node.max()) + 1 if workers else 1
        self.cores = cluster.host_cores or cluster.cores_per_node
        # which pool of cores each worker's compute competes in: its node's, or the one host's
        self.pool = np.zeros_like(self.node) if cluster.host_cores else self.node
        self.pools = int(self.pool.max()) + 1 if workers else 1
        self.lanes = cluster.compute_lanes
        #: the share of a worker's peers on other nodes (0 on one node, 1 with one worker per node)
        self.remote_share = (float(np.mean(self.node[:, None] != self.node[None, :])) * workers / (workers - 1)
                             if workers > 1 else 0.0)
        self.R = 3 * workers + (self.pools if self.cores else 0)
        self._memo: dict[tuple, Cost] = {}

    # -- what strategies' estimates use ------------------------------------------------------------------
    def links(self, src: np.ndarray, dst: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        """Transfer seconds and extra latency of sends ``src[i] -> dst[i]`` of ``nbytes`` each."""
        same = self.node[src] == self.node[dst]
        local = self.profile.link_s(nbytes, True, self.cluster)
        remote = self.profile.link_s(nbytes, False, self.cluster)
        x = np.where(same, local[0], remote[0])
        lat = np.where(same, local[1], remote[1])
        return x, lat

    def enc(self, codec: Codec, n: int) -> float:
        """Seconds to encode ``n`` elements (with error feedback where the plan has it)."""
        return self.profile.encode_s(str(codec), n, feedback.resolve(codec, self.error_feedback))

    def dec(self, codec: Codec, n: int) -> float:
        return self.profile.decode_s(str(codec), n)

    def merge(self, n: int, inputs: int) -> float:
        return self.profile.merge_s(n, inputs)

    def dec_merged(self, codec: Codec, n: int) -> float:
        """Seconds for a decode only a merge reads, as the simulator prices it (``casync.sim.optable.cost_key``):
        a sparsifier's is handed to the merge as its entries (``casync.primitives.merge.Sparse``), a block decoder's
        is decoded block by block as the merge adds (``casync.primitives.merge.Deferred``), any other is no output
        and runs as ``Codec.decode_shared`` (the identity's: its payload's own array)."""
        if codec.decodes_sparse:
            return self.profile.entries_s(str(codec), n)
        if codec.decodes_in_blocks:
            return self.profile.deferred_s(str(codec), n)
        return self.profile.shared_s(str(codec), n)  # no output: Codec.decode_shared

    def merge_decoded(self, n: int, decoded: int, local: int, codec: Codec,
                      encoded_by: Codec | None = None) -> float:
        """Seconds to merge ``decoded`` payloads of ``codec`` with ``local`` dense inputs: a sparsifier's
        entries, and a block decoder's payloads where the profile prices them (``Profile.deferred_s``), are
        charged with their decodes, so only the dense inputs (at least one pass) count.
        ``encoded_by``: the codec of the encode that alone reads the merge; where it has error feedback and
        computes the merge as it adds its residual, one pass fewer (``casync.sim.optable.folded_merge``)."""
        own = codec.decodes_sparse or (codec.decodes_in_blocks and self.profile.prices_deferred(str(codec)))
        inputs = merged_inputs(local, decoded) if own else decoded + local
        folds = encoded_by is not None and merges_in_encode(encoded_by)
        if folds and feedback.resolve(encoded_by, self.error_feedback):
            inputs = max(0, inputs - 1)
        handed = decoded and (codec.decodes_sparse or codec.decodes_in_blocks)  # its merge adds them itself
        return self.profile.merge_s(n, inputs, codec_key=str(codec) if handed else "")

    def slots(self, pattern: str, K: int) -> tuple[int, int]:
        """Transfer slots of a shifted exchange of ``K`` partitions (see :func:`casync.planner.slots.slots`)."""
        return slots(pattern, self.N, K)

    def single(self, acc: Usage, n: int, K: int, codec: Codec) -> tuple[float, int]:
        """One worker: encode, decode and merge each partition in turn, nothing on the wire."""
        per = self.enc(codec, n) + self.dec(codec, n) + self.profile.merge_s(n, 1)
        total = self.o + K * per
        acc.use(0, np.array([0]), 0.0, total, total)
        return total, 0

    # -- public --------------------------------------------------------------------------------------------
    def cost(self, numel: int, option: Option) -> Cost:
        key = (numel, option.strategy, str(option.codec), option.partitions)
        c = self._memo.get(key)
        if c is None:
            c = self._memo[key] = self._compute(numel, option)
        return c

    def _compute(self, numel: int, option: Option) -> Cost:
        N, K = self.N, max(1, min(option.partitions, numel)) if numel else 1
        n = -(-numel // K) if numel else 0
        strategy = get_strategy(option.strategy)
        acc = Usage(N)
        estimated = strategy.estimate(self, acc, n, K, option.codec)
        if estimated is None:
            return self._simulated(numel, option)
        L, wire = estimated
        return self._finish(acc, L, wire, strategy.op_count(N, K), strategy.coupling(N, K))

    def _simulated(self, numel: int, option: Option) -> Cost:
        """The bucket alone through the real simulator, for a strategy without an analytical estimate."""
        from ..plan.assemble import BucketChoice, assemble_plan
        from ..plan.specs import TensorSpec
        from ..sim.optable import OpTable
        from ..sim.simulator import run_table

        spec = TensorSpec("bucket", (numel,))
        choice = BucketChoice(strategy=option.strategy, codec=option.codec, partitions=option.partitions,
                              two_way=self.two_way)
        plan = assemble_plan([spec], self.N, [(spec.name, [spec])], [choice], error_feedback=self.error_feedback,
                             op=self.op)
        timeline = run_table(OpTable.from_graph(plan.graph), self.cluster, self.profile, {})
        acc = Usage(self.N)
        peers = dict(plan.graph.nodes(data="peer"))
        for r in timeline.records:
            actor = Actor.parse(r["actor"])
            lane = r["lane"].rsplit("/", 1)[1]
            if r["op"] in ("wire", "send") and (lane == "egress" or r["op"] == "wire"):
                for kind, who in ((1, actor), (2, Actor.parse(peers[r["node"]]))):
                    if who.is_worker:
                        acc.use(kind, [who.index], r["start"], r["end"], r["end"] - r["start"])
            elif lane.startswith("compute") and actor.is_worker:
                acc.use(0, [actor.index], r["start"], r["end"], r["end"] - r["start"])
        for node in plan.nodes(op="send"):
            sender = Actor.parse(plan.graph.nodes[node]["actor"])
            if sender.is_worker:
                acc.sent(self, [sender.index], 1, plan.graph.nodes[node]["nbytes"])
        return self._finish(acc, timeline.iteration_time, plan.wire_bytes(), plan.graph.number_of_nodes(), 0.0)

    def _finish(self, acc: Usage, L: float, wire: int, ops: int, coupling: float) -> Cost:
        work = np.concatenate([acc.work[0] / self.lanes, acc.work[1], acc.work[2]])
        first = np.concatenate(acc.first)
        last = np.concatenate(acc.last)
        used = work > 0
        head_min = float(first[used].min()) if used.any() else 0.0
        tail_min = float((L - last[used]).min()) if used.any() else 0.0
        if self.cores:
            node_work = np.zeros(self.pools)
            np.add.at(node_work, self.pool, acc.work[0] / min(self.cores, self.lanes * self._wpp()))
            np.add.at(node_work, self.pool, acc.threads / self.cores)  # the threads run on any of the cores
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
        return Cost(L=float(L), head=head, work=work, tail=tail, wire=int(wire), ops=ops,
                    coupling=coupling if self.N > 1 else 0.0)

    def backward(self, seconds: float) -> np.ndarray:
        """Per resource: what the workers' backward passes take of their pools of cores over ``seconds`` of a
        backward (:meth:`Profile.backward_share` per worker, in the pool's own units: seconds of all its cores
        busy); zero where no cores are modelled or the profile charges no backward."""
        out = np.zeros(self.R)
        if self.cores and seconds > 0 and self.profile.backward_cores > 0:
            members = np.bincount(self.pool, minlength=self.pools)
            for p in range(self.pools):
                out[3 * self.N + p] = members[p] * self.profile.backward_share(self.cores, int(members[p])) \
                    * seconds / self.cores
        return out

    def _wpp(self) -> int:
        """Most workers competing in one pool of cores."""
        return max(1, int(np.bincount(self.pool).max()))


__all__ = ["IDENTITY", "Cost", "Estimator", "Option", "Usage"]
