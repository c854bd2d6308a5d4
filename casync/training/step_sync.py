"""Step-by-step synchronization on one actor of a Trainer: its share of every step's sync, on the executor.

The Trainer's actors form a torch.distributed process group (as ``RayEngine``'s do) and each runs its share of
the plan on a :class:`~casync.engines.executor.RankExecutor`.  Steps are synchronized one after another on a
sync thread of the actor, so step t's sync can still run while step t+1's gradients are produced (delayed
updates); a worker hands each bucket to the executor as soon as backward has filled it.  Residuals commit
when a step's sync ends; the residuals from before the last committed step are kept, so a step voided for
NaN/Inf can be rolled back.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from casync.primitives.codecs import Codec

from ..engines.executor import RankExecutor
from ..engines.memory import keep_freed_memory
from ..engines.nonfinite import BucketLayout, GradientScan, NonFiniteReport
from ..errors import SyncError, SyncTimeoutError
from ..runtime.data_plane import DataPlaneMember
from ..schedule import ActorShare

SYNC_GROUP = "sync"


@dataclass
class StepState:
    """One step's synchronization on one actor: its gradients, what is in, and what came out."""

    step: int
    full: bool
    grads: dict[str, np.ndarray]
    remaining: dict[str, int]  # bucket -> members whose gradient has not arrived yet
    codecs: dict[str, Codec] | None = None  # this step's codecs when they differ from the plan's (warm-up)
    filled: set[str] = field(default_factory=set)
    provided: set[str] = field(default_factory=set)
    begun: bool = False
    failed: str | None = None
    finished: bool = False
    sent: int = 0
    raw: int = 0
    results: dict[str, np.ndarray] | None = None
    records: list[tuple] = field(default_factory=list)
    compute: list[tuple] = field(default_factory=list)
    nonfinite: list[NonFiniteReport] = field(default_factory=list)  # what this worker's scans found
    momentum: dict[str, np.ndarray] | None = None  # momentum-correction buffers before the step (to void it)


class StepSyncActor(DataPlaneMember):
    """Runs one actor's share of every step's sync (a PS server of a Trainer uses it as is)."""

    def __init__(self, name: str, shares: dict[bool, ActorShare], codecs: dict[str, Codec], plan_seed: int,
                 partitions: dict[str, list[tuple[int, int]]], timeout_s: float, compute_threads: int = 1):
        keep_freed_memory()  # before any thread of ours allocates: each step's buffers reuse the last step's pages
        self.name = name
        self.timeout_s = timeout_s
        self._shares = shares  # full precision? -> this actor's share of that plan
        self._codecs = dict(codecs)
        self._plan_seed = plan_seed
        self._partitions = partitions
        self._timeout_s = timeout_s
        self._compute_threads = compute_threads
        self._executors: dict[bool, RankExecutor] = {}
        self.residuals: dict[str, np.ndarray] = {}
        self._previous: tuple[int, dict[str, np.ndarray]] | None = None  # (step, residuals before it)
        self._layouts: dict[str, BucketLayout] = {}  # a worker's buckets, for its NaN/Inf scans
        self._rank = -1
        self._steps: dict[int, StepState] = {}
        self._cond = threading.Condition()
        self._broken: str | None = None
        self._next = 0  # the next step the sync thread takes
        self._thread = threading.Thread(target=self._sync_loop, daemon=True, name=f"casync-sync-{name}")

    def ready(self) -> str:
        return self.name

    # -- the process group --------------------------------------------------------------------------------------
    def _on_channel(self, channel: Any) -> None:
        """Build an executor per plan (the compressed one, and the full-precision one if any) and start syncing."""
        scan = GradientScan(self._rank, self._layouts) if self._rank >= 0 else None
        self._executors = {full: RankExecutor(share, self._codecs, self._plan_seed, self._partitions, channel,
                                              self._timeout_s, compute_threads=self._compute_threads, scan=scan)
                           for full, share in self._shares.items()}
        self._thread.start()

    def start_at(self, step: int) -> None:
        """The first step the sync thread will take (after a checkpoint is loaded)."""
        with self._cond:
            self._next = step
            self._cond.notify_all()

    # -- a step's synchronization ---------------------------------------------------------------------------------
    def _open(self, step: int, full: bool, grads: dict[str, np.ndarray], remaining: dict[str, int],
              codecs: dict[str, Codec] | None = None) -> StepState:
        st = StepState(step, full, grads, remaining, codecs)
        with self._cond:
            if self._broken:
                raise SyncError(f"{self.name}: {self._broken}")
            if step in self._steps:
                raise SyncError(f"{self.name}: step {step} started twice")
            self._steps[step] = st
            self._cond.notify_all()
        return st

    def begin(self, step: int, full: bool, codecs: dict[str, Codec] | None = None) -> None:
        """Open ``step`` on an actor without gradients of its own (a PS server)."""
        self._open(step, full, {}, {}, codecs)

    def _bucket_in(self, st: StepState, bucket: str) -> None:
        """This worker's gradient of ``bucket`` is complete: hand it over (now, if the step's sync has begun;
        else the sync thread does when it begins); the executor's ops scan it for NaN/Inf as they read it.
        Call with the lock held."""
        if not st.begun or bucket in st.provided:
            return
        st.provided.add(bucket)
        self._executors[st.full].provide(bucket, st.grads[bucket])

    def _sync_loop(self) -> None:
        """Take steps in order: begin the executor, hand over the buckets already in, run the step's ops."""
        while True:
            with self._cond:
                while self._next not in self._steps and not self._broken:
                    self._cond.wait()
                if self._broken:
                    return
                st = self._steps[self._next]
                executor = self._executors[st.full]
                residuals = self.residuals
            try:
                # outside the lock: begin starts the step's transport threads, which can take milliseconds on
                # busy cores, and backward's hooks take the lock to fill buckets meanwhile
                executor.begin(st.step, residuals, st.codecs)
                with self._cond:
                    st.begun = True
                    for bucket, left in st.remaining.items():
                        if left == 0:
                            self._bucket_in(st, bucket)
            except BaseException as exc:
                with self._cond:
                    st.failed = f"{type(exc).__name__}: {exc}"
                    self._cond.notify_all()
                return
            try:
                results, residuals, records = executor.finish()
            except BaseException as exc:  # the step's finish() reports it
                with self._cond:
                    st.failed = f"{type(exc).__name__}: {exc}"[:500]
                    self._broken = f"step {st.step} failed: {st.failed}"
                    self._cond.notify_all()
                return
            with self._cond:
                self._previous = (st.step, self.residuals)
                self.residuals = residuals
                st.results, st.records, st.finished = results, records, True
                st.nonfinite = list(executor.nonfinite)
                st.sent, st.raw = executor.sent_bytes, executor.raw_bytes
                self._next = st.step + 1
                self._cond.notify_all()

    @ray.method(concurrency_group=SYNC_GROUP, num_returns=2)
    def finish(self, step: int, *after: Any) -> tuple[dict[str, Any], list[NonFiniteReport]]:
        """Wait for ``step``'s sync on this actor; returns its op records and bytes, and (second return) this
        worker's NaN/Inf reports alone: every worker's ``apply`` takes all of them, so each decides alike
        whether the step is voided."""
        deadline = time.monotonic() + self._timeout_s
        with self._cond:
            while True:
                st = self._steps.get(step)
                if st is None and step < self._next:
                    raise SyncError(f"{self.name}: step {step} finished twice or never started")
                if st is None:  # train_step (or begin) has not opened it yet: it runs in another Ray thread
                    pass
                elif st.failed:
                    raise SyncError(f"{self.name}, step {step}: {st.failed}")
                elif st.finished:
                    break
                if self._broken:
                    raise SyncError(f"{self.name}: {self._broken}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SyncTimeoutError(f"{self.name}: step {step} not synchronized within {self._timeout_s:.0f}s")
                self._cond.wait(min(left, 1.0))
            self._finished(st)
        return {"records": st.records, "sent": st.sent, "raw": st.raw, "nonfinite": st.nonfinite}, st.nonfinite

    def rollback(self, step: int, rerun: bool = False) -> None:
        """Undo ``step``'s residual updates (it was voided for NaN/Inf); only the last committed step can be.
        ``rerun``: the step will be run again (``nonfinite="raise"``): the sync thread takes it next."""
        with self._cond:
            if self._previous is not None and self._previous[0] == step:
                self.residuals, self._previous = self._previous[1], None
            if rerun and self._next == step + 1:
                self._next = step

    def _finished(self, st: StepState) -> None:
        self._steps.pop(st.step, None)  # a server has nothing to apply: the step is done

    def discard(self, reason: str = "the driver gave up on this step after a failure elsewhere") -> None:
        """Fail every open step; the actor is unusable afterwards."""
        with self._cond:
            self._broken = reason
            for st in self._steps.values():
                st.failed = reason
            self._cond.notify_all()
        for executor in self._executors.values():
            executor.channel.abort(reason)

    def restart(self, *args: Any) -> None:
        """Take a new run in this process (``Trainer.restart``): end this run's sync thread, drop everything of the
        run (executors, open steps, residuals), leave the data plane, and run the constructor again with ``args``,
        so that nothing of the old run survives that a fresh actor would not have.  The driver then forms the new
        data plane (:meth:`connect`).  Called on an idle actor: a sync thread still in a step after the timeout is
        a :class:`SyncError`."""
        with self._cond:
            self._broken = "restarting for a new run"
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(self._timeout_s)
            if self._thread.is_alive():
                raise SyncError(f"{self.name}: its sync thread is still in step {self._next} after "
                                f"{self._timeout_s:.0f}s; it cannot restart")
        self._drop_run()
        self.leave()  # collects the dropped executors first: nothing holds a view of the old arenas after it
        self.__init__(*args)

    def _drop_run(self) -> None:
        """Let go of what refers to the run's buffers and executors (before :meth:`leave` collects them)."""
        self._executors, self._steps, self.residuals, self._previous = {}, {}, {}, None

    def get_residuals(self) -> dict[str, np.ndarray]:
        return self.residuals

    def set_residuals(self, residuals: dict[str, np.ndarray]) -> None:
        self.residuals = {k: np.array(v, dtype=np.float32, copy=True) for k, v in residuals.items()}
        self._previous = None
