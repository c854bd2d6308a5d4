"""Measure one plan on :class:`~casync.runtime.ray_engine.RayEngine`: sync time, checks, the timeline.

The gradients are made by a Ray task on each worker actor's own node (:class:`GradientStore`), so loading
them into the actors never crosses a link; the sync time is the span of the engine's timeline, from the
moment the first actor starts its step (its ``load`` row: the posting of its receives; the gradients arrive as
zero-copy views, nothing is copied, and the NaN/Inf scan runs inside the ops that first read each partition) to
the last op of any worker -- the engine's own synchronization, the counterpart of the baselines' all-reduce span
(:func:`step_span`; :func:`sync_span` leaves the load rows out, as the calibration does).  ``wall_s`` is
``run_flat``'s wall time, which adds handing the gradients to the actors and fetching every worker's result
back to the driver.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..engines.memory import WARMUP_SYNCS
from ..plan.syncplan import SyncPlan
from ..runtime.gradients import GradientStore


@dataclass
class EngineRun:
    """What one plan did on the engine over the timed iterations."""

    sync_s: list[float]
    wall_s: list[float]
    consistent: bool
    rel_error: float
    nodes: dict[str, str]
    timeline: list[dict[str, Any]] = field(default_factory=list)  # the median iteration's op records
    tasks: int = 0
    link_bytes: int | None = None  # bytes that crossed the links between worker nodes, per timed iteration

    @property
    def sync_median_s(self) -> float:
        return statistics.median(self.sync_s)


def sync_span(rows: list[dict[str, Any]]) -> float:
    """First op start to last op end over every actor, the gradient load left out."""
    ops = [r for r in rows if r["op"] != "load"]
    if not ops:
        raise ValueError("the timeline has no ops")
    return max(r["end"] for r in ops) - min(r["start"] for r in ops)


def step_span(rows: list[dict[str, Any]]) -> float:
    """The benchmark's sync time of one step: from the first actor's start of the step (its ``load`` row) to
    the last op's end over every actor.

    The load row holds the posting of the actor's receives (and, where the driver handed over gradients it
    scanned, nothing more); the NaN/Inf scan runs inside the ops, so both spans count it.  Leaving the load row
    out (:func:`sync_span`) would drop casync work from casync's span while the baselines' spans and the
    DDP + casync hook rows include all of theirs."""
    ops = [r for r in rows if r["op"] != "load"]
    if not ops:
        raise ValueError("the timeline has no ops")
    return max(r["end"] for r in ops) - min(r["start"] for r in rows)


def measure_plan(plan: SyncPlan, store: GradientStore, exact: np.ndarray | None, *, address: str | None,
                 iters: int = 3, warmup: int = WARMUP_SYNCS, spread: bool = False, timeout_s: float = 300.0,
                 link_bytes: Callable[[], int | None] | None = None, transport: str = "gloo",
                 compute_threads: int = 1) -> EngineRun:
    """Run ``plan`` for ``warmup + iters`` iterations on a fresh RayEngine; time the last ``iters``.

    Every iteration checks that all workers hold bit-identical results; the first also measures the
    relative error against ``exact`` (the true mean), before error feedback has any history.
    ``spread``: fail unless every worker actor landed on its own node (the emulated cluster).
    ``link_bytes``: a counter of bytes sent between worker nodes (the emulated links), read around the timed
    iterations.  ``compute_threads``: ops each actor runs at once.
    """
    from ..runtime.ray_engine import RayEngine

    with RayEngine(plan, address=address, timeout_s=timeout_s, placement="spread", transport=transport,
                   compute_threads=compute_threads) as engine:
        actor_nodes = engine.actor_nodes()
        workers = [f"worker:{w}" for w in range(plan.workers)]
        if spread and len({actor_nodes[w] for w in workers}) < len(workers):
            raise RuntimeError(f"worker actors share nodes ({actor_nodes}); the comparison needs one worker per "
                               "node -- does the cluster have a node per worker?")
        flats = store.refs(plan, [actor_nodes[w] for w in workers])
        syncs, walls, timelines = [], [], []
        consistent, rel_error = True, float("nan")
        counted = None
        for i in range(warmup + iters):
            if i == warmup and link_bytes is not None:
                counted = link_bytes()
            t0 = time.perf_counter()
            results = engine.run_flat(flats)
            wall = time.perf_counter() - t0
            rows = engine.timeline(engine.step - 1)
            consistent &= all(np.array_equal(results[0][b], r[b]) for r in results[1:] for b in results[0])
            if i == 0 and exact is not None:
                got = np.concatenate([results[0][b.name] for b in plan.buckets])
                rel_error = float(np.linalg.norm(got - exact) / np.linalg.norm(exact))
            del results
            if i >= warmup:
                syncs.append(step_span(rows))
                walls.append(wall)
                timelines.append(rows)
        if counted is not None:
            counted = (link_bytes() - counted) // iters
        median_index = sorted(range(len(syncs)), key=syncs.__getitem__)[len(syncs) // 2]
        return EngineRun(link_bytes=counted, sync_s=syncs, wall_s=walls, consistent=consistent, rel_error=rel_error,
                         nodes={w: actor_nodes[w] for w in workers}, timeline=timelines[median_index],
                         tasks=engine.calls_per_step)
