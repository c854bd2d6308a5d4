"""How many transfer slots a shifted all-to-all exchange takes under the schedule's list scheduling.

The PS and all-gather estimates (``casync.strategies.ps``, ``casync.strategies.allgather``) use it: the simulator never
backfills a NIC, so the order in which sends become ready decides how long an exchange takes.
"""
from __future__ import annotations

import heapq
from functools import lru_cache


@lru_cache(maxsize=None)
def slots(pattern: str, N: int, K: int) -> tuple[int, int]:
    """Transfer slots the simulator's list scheduling needs for an all-gather (``"ag"``) or a PS
    push-then-pull (``"ps"``) exchange of ``K`` partitions among ``N`` workers: ``(first phase, total)``.

    Transfers take one unit each and start, in the schedule's order (ready time, then the send's shifted
    ``round``, then node id; ``casync.schedule``), when both the sender's egress and the receiver's ingress
    are free — no backfilling, as in :func:`casync.sim.simulator.simulate`.  The PS and all-gather strategies
    tag their exchanges with shifted rounds (every worker sends k places ahead at round k), a perfect
    matching of N-1 slots.  A PS pull becomes ready when the last push of its partition arrived.
    """

    def rnd(k: int) -> int:
        return k % N

    # a worker encodes its partitions one after the other (PS push encodes in round order), so the sends of
    # its k-th encoded partition become ready a little after those of its (k-1)-th: k orders before round
    heap: list[tuple[float, int, str, int, int, int, int]] = []
    order = sorted(range(K), key=lambda p: f"p{p}/")
    by_round = pattern == "ps"
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
    return round(first if pattern == "ps" else end), round(end)


