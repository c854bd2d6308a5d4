"""Step-by-step synchronization on one actor of a Trainer: a worker's (or PS server's) share of every step's sync.

Each step gets its own core (``casync.runtime.ray_actor.SyncActor``), so step t's sync can finish while step
t+1's gradients are being produced.  Tasks wait on Ray threads (the ``sync`` concurrency group) and compute
on one compression thread.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from primitives.codecs import Codec, payload_nbytes

from ..engines.nonfinite import BucketLayout, NonFiniteReport, scan_worker
from ..errors import SyncError, SyncTimeoutError
from ..runtime.ray_actor import SyncActor
from ..schedule import FusedTask

SYNC_GROUP = "sync"


@dataclass
class StepState:
    """One step's synchronization on one actor: its SyncActor core and the gradient-readiness bookkeeping."""

    step: int
    core: SyncActor | None
    grads: dict[str, np.ndarray]
    remaining: dict[str, int]  # bucket -> members whose gradient has not arrived yet
    filled: set[str] = field(default_factory=set)
    fresh: bool = True  # no op ran yet: error-feedback residuals are taken at the first one
    failed: str | None = None
    finished: bool = False
    sent: int = 0
    raw: int = 0
    results: dict[str, np.ndarray] | None = None
    compute: list[tuple] = field(default_factory=list)
    scanned: set[str] = field(default_factory=set)  # buckets whose local gradient was checked for NaN/Inf
    nonfinite: list[NonFiniteReport] = field(default_factory=list)  # what those checks found
    momentum: dict[str, np.ndarray] | None = None  # momentum-correction buffers before the step (to void it)


class StepSyncActor:
    """Runs one actor's fused sync tasks step by step (a PS server of a Trainer uses it as is).

    Each step gets its own :class:`~casync.runtime.ray_actor.SyncActor` core, so step t's sync can finish
    while step t+1's gradients are being produced.  Residuals commit when a step finishes; the next step's
    ops read them at their first op (the driver orders that first op after the commit).  The residuals from
    before the last committed step are kept, so a step voided for NaN/Inf can be rolled back.
    """

    def __init__(self, name: str, tasks: list[FusedTask], codecs: dict[str, Codec], plan_seed: int,
                 partitions: dict[str, list[tuple[int, int]]], timeout_s: float):
        self.name = name
        self._tasks = tasks
        self._task_by_id = {t.id: t for t in tasks}
        self._needs_local = {t.id for t in tasks if any(s.attrs.get("local_input") for s in t.steps)}
        self._codecs = dict(codecs)
        self._plan_seed = plan_seed
        self._partitions = partitions
        self._timeout_s = timeout_s
        self.residuals: dict[str, np.ndarray] = {}
        self._previous: tuple[int, dict[str, np.ndarray]] | None = None  # (step, residuals before it)
        self._layouts: dict[str, BucketLayout] = {}  # a worker's buckets, for its NaN/Inf scans
        self._rank = -1
        self._steps: dict[int, StepState] = {}
        self._cond = threading.Condition()
        self._broken: str | None = None
        self._compressor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="casync-compress")

    def ready(self) -> str:
        return self.name

    # -- a step's synchronization ---------------------------------------------------
    def _open(self, step: int, grads: dict[str, np.ndarray], remaining: dict[str, int],
              codecs: dict[str, Codec] | None = None) -> StepState:
        core = SyncActor(self.name, self._tasks, codecs or self._codecs, self._plan_seed, self._partitions)
        core.grads = grads
        st = StepState(step, core, grads, remaining)
        with self._cond:
            if self._broken:
                raise SyncError(f"{self.name}: {self._broken}")
            if step in self._steps:
                raise SyncError(f"{self.name}: step {step} started twice")
            self._steps[step] = st
            self._cond.notify_all()
        return st

    def begin(self, step: int, *after: Any) -> None:
        """Open ``step`` on an actor without gradients of its own (a PS server)."""
        self._open(step, {}, {})

    def _wait_for(self, step: int, bucket: str | None) -> StepState:
        """Block until ``step`` is open and, when ``bucket`` is given, this actor's gradient of it is in."""
        deadline = time.monotonic() + self._timeout_s
        with self._cond:
            while True:
                if self._broken:
                    raise SyncError(f"{self.name}: {self._broken}")
                st = self._steps.get(step)
                if st is not None:
                    if st.failed:
                        raise SyncError(f"{self.name}, step {step}: {st.failed}")
                    if bucket is None or st.remaining.get(bucket, 0) == 0:
                        return st
                left = deadline - time.monotonic()
                if left <= 0:
                    what = f"step {step} to start" if st is None else f"its gradient of bucket {bucket!r} in step {step}"
                    raise SyncTimeoutError(f"{self.name}: waited {self._timeout_s:.0f}s for {what}")
                self._cond.wait(left)

    @ray.method(concurrency_group=SYNC_GROUP)
    def run(self, step: int, task_id: int, n_after: int, *args: Any) -> Any:
        """A fused sync task: wait (on a Ray thread) for the step and local gradients, compute on the
        compression thread."""
        task = self._task_by_id[task_id]
        st = self._wait_for(step, task.bucket if task_id in self._needs_local else None)
        return self._compressor.submit(self._run_ops, st, task, step, n_after, args).result()

    def _run_ops(self, st: StepState, task: FusedTask, step: int, n_after: int, args: tuple) -> Any:
        if st.fresh:
            st.core.pending = dict(self.residuals)
            st.fresh = False
        if task.bucket not in st.scanned and task.id in self._needs_local:
            self._scan(st, task.bucket)
        out = st.core.run(step, task.id, n_after, *args)
        if task.outputs:
            st.sent += sum(payload_nbytes(p) for p in out[:-1])
            st.raw += sum(4 * s.attrs["numel"] for s in task.steps if s.attrs["op"] == "send")
        return out

    def _scan(self, st: StepState, bucket: str) -> None:
        """Check this worker's gradient of ``bucket`` for NaN/Inf before its first op (on the compression
        thread, so before any encode of it): name what is found, and flag the partitions whose encodes must
        carry the values on the side (``primitives.finite``)."""
        st.scanned.add(bucket)
        layout = self._layouts.get(bucket)
        if layout is None or bucket not in st.grads:
            return
        found, parts = scan_worker([layout], self._rank, st.grads)
        st.nonfinite.extend(found)
        st.core.flagged.update(parts)

    @ray.method(concurrency_group=SYNC_GROUP, num_returns=2)
    def finish(self, step: int, *tokens: Any) -> tuple[dict[str, Any], list[NonFiniteReport]]:
        """After every task of ``step`` on this actor: commit residuals, keep the results, report the ops.
        The second return is this worker's NaN/Inf reports alone: every worker's ``apply`` takes all of them,
        so each decides alike whether the step is voided."""
        with self._cond:
            st = self._steps.get(step)
        if st is None:
            raise SyncError(f"{self.name}: step {step} finished without having started")
        records = self._compressor.submit(self._finish_ops, st).result()
        self._finished(st)
        return {"records": records, "sent": st.sent, "raw": st.raw, "nonfinite": st.nonfinite}, st.nonfinite

    def _finish_ops(self, st: StepState) -> list[tuple]:
        for bucket in self._layouts.keys() - st.scanned:  # a bucket no op of this actor read: still named
            self._scan(st, bucket)
        results, records, _ = st.core.collect(st.step)
        if not st.fresh:
            self._previous = (st.step, self.residuals)
            self.residuals = st.core.residuals
        st.results, st.finished, st.core = results, True, None
        return records

    def rollback(self, step: int) -> None:
        """Undo ``step``'s residual updates (it was voided for NaN/Inf); only the last committed step can be."""
        if self._previous is not None and self._previous[0] == step:
            self.residuals, self._previous = self._previous[1], None

    def _finished(self, st: StepState) -> None:
        with self._cond:  # a server has nothing to apply: the step is done
            self._steps.pop(st.step, None)

    def discard(self, reason: str = "the driver gave up on this step after a failure elsewhere") -> None:
        """Fail every open step (tasks waiting on them raise at once); the actor is unusable afterwards."""
        with self._cond:
            self._broken = reason
            for st in self._steps.values():
                st.failed = reason
            self._cond.notify_all()

    def get_residuals(self) -> dict[str, np.ndarray]:
        return self.residuals

    def set_residuals(self, residuals: dict[str, np.ndarray]) -> None:
        self.residuals = {k: np.array(v, dtype=np.float32, copy=True) for k, v in residuals.items()}
        self._previous = None
