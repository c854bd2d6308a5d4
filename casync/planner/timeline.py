"""Espresso's timeline model: buckets claim per-worker compute / egress / ingress in ready order.

The planner's estimate of an iteration: each bucket option's :class:`~casync.planner.estimator.Cost`
is laid on the resources it uses, after the work already queued there; :meth:`Timeline.batch` evaluates
every option of one bucket at once (NumPy, a leading option axis).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..plan.assemble import bucket_priority
from .estimator import Cost

#: seconds: smaller estimated differences are ties
TOL = 1e-9


#: Share of a bucket's queueing delay (work already waiting on the lanes it uses when it becomes ready)
#: that lengthens its own hop chain: ops of all pending buckets interleave in ready order, so a bucket
#: arriving behind a backlog neither waits for all of it nor none of it (fitted against the simulator).
THETA = 0.5


@dataclass
class Stack:
    """Costs of several options of one bucket as arrays (leading axis: option)."""

    head: np.ndarray
    work: np.ndarray
    tail: np.ndarray
    L: np.ndarray
    coupling: np.ndarray

    @classmethod
    def of(cls, costs: Sequence[Cost]) -> "Stack":
        return cls(head=np.stack([c.head for c in costs]), work=np.stack([c.work for c in costs]),
                   tail=np.stack([c.tail for c in costs]), L=np.array([c.L for c in costs]),
                   coupling=np.array([c.coupling for c in costs]))


def step(free: np.ndarray, mt: np.ndarray, r: float, head: np.ndarray, work: np.ndarray, tail: np.ndarray,
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


class Timeline:
    """Espresso-style timeline model: buckets claim per-worker compute / egress / ingress in ready order, ties
    (buckets ready together) in the order of the schedule's bucket priority (``bucket_priority``)."""

    def __init__(self, ready: Sequence[float], workers: int, resources: int,
                 backward: Callable[[float], np.ndarray] | None = None):
        """``backward(seconds)``: per resource, the work a backward pass puts on it over that long
        (``Estimator.backward``), charged from each ready time to the next before the bucket ready then claims its
        work, as the simulator charges it; None: nothing."""
        self.ready = list(ready)
        self.N = workers
        self.R = resources
        self.order = sorted(range(len(ready)), key=lambda b: (ready[b], bucket_priority(b, len(ready))))
        self.pos = {b: i for i, b in enumerate(self.order)}
        # per position: (when the backward's slice before it starts, its work per resource), or None
        self.background: list[tuple[float, np.ndarray] | None] = [None] * len(self.order)
        if backward is not None:
            for i in range(1, len(self.order)):
                start, end = self.ready[self.order[i - 1]], self.ready[self.order[i]]
                work = backward(end - start) if end > start else None
                if work is not None and np.any(work > 0):
                    self.background[i] = (start, work)

    def _backward(self, free: np.ndarray, i: int) -> np.ndarray:
        """``free`` after the backward's slice before position ``i`` took its share of the cores."""
        slice_ = self.background[i]
        if slice_ is None:
            return free
        start, work = slice_
        return np.where(work > 0, np.maximum(free, start) + work, free)

    def run(self, costs: Sequence[Cost]) -> tuple[float, float, list[float], list[tuple]]:
        """(iteration time, sum of finishes, finish per bucket, state before each position)."""
        free, mt = np.zeros(self.R), np.full(self.R, -np.inf)
        end = total = 0.0
        fins = [0.0] * len(costs)
        states = []
        for i, b in enumerate(self.order):
            states.append((free, mt, end, total))
            free = self._backward(free, i)
            c = costs[b]
            free, mt, fin = step(free, mt, self.ready[b], c.head, c.work, c.tail, c.L, c.coupling, self.N)
            fins[b] = float(fin)
            end = max(end, fins[b])
            total += fins[b]
        return end, total, fins, states

    def batch(self, states: list[tuple], b: int, stack: Stack, costs: Sequence[Cost]) -> tuple[np.ndarray, np.ndarray]:
        """Iteration time and sum of finishes for every option of bucket ``b`` (others as in ``costs``)."""
        i = self.pos[b]
        free, mt, end, total = states[i]
        free = self._backward(free, i)
        free, mt, fin = step(free, mt, self.ready[b], stack.head, stack.work, stack.tail, stack.L,
                              stack.coupling, self.N)
        end = np.maximum(end, fin)
        total = total + fin
        for j, other in enumerate(self.order[i + 1:], i + 1):
            free = self._backward(free, j)
            c = costs[other]
            free, mt, fin = step(free, mt, self.ready[other], c.head, c.work, c.tail, c.L, c.coupling, self.N)
            end = np.maximum(end, fin)
            total = total + fin
        return end, total


def timeline_estimate(costs: Sequence[Cost], ready: Sequence[float], workers: int) -> tuple[float, list[float]]:
    """Estimated iteration time and per-bucket finish of buckets with ``costs`` ready at ``ready``."""
    end, _, fins, _ = Timeline(ready, workers, costs[0].work.shape[0]).run(costs)
    return end, fins


def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Lexicographic (iteration time, sum of finishes) with a tolerance: is ``a`` strictly better?"""
    tol = max(TOL, 1e-6 * abs(b[0]))
    if a[0] < b[0] - tol:
        return True
    if a[0] > b[0] + tol:
        return False
    return a[1] < b[1] - max(TOL, 1e-6 * abs(b[1]))
