"""The Ray actor that executes one worker's (or server's) share of a plan, task by task (``casync.schedule``)."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray

from casync.primitives.ir import Actor
from casync.primitives.ops import run_node

from ..engines.memory import keep_freed_memory
from ..engines.nonfinite import BucketLayout, NonFiniteReport, scan_worker
from ..schedule import FusedTask
from .actor_process import ActorProcess


class SyncActor(ActorProcess):
    """Holds its worker's gradients, its error-feedback residuals and its results between calls.

    The driver submits every task of an iteration at once; payloads from other actors arrive as resolved
    ObjectRef arguments (NumPy arrays, zero-copy on one node).  Residuals updated during a step are
    committed only by :meth:`collect`, so a failed iteration leaves the saved state untouched; with
    ``keep_previous`` the state before the step is kept until the next load, so the driver can
    :meth:`rollback` a step it voids after the fact (NaN/Inf found by an actor's own scan).
    """

    def __init__(self, name: str, tasks: list[FusedTask], codecs: dict, plan_seed: int,
                 partitions: dict[str, list[tuple[int, int]]], layouts: list[BucketLayout] | None = None):
        keep_freed_memory()
        self.name = name
        self.tasks = {t.id: t for t in tasks}
        self.codecs = codecs
        self.plan_seed = plan_seed
        self.partitions = partitions
        self.layouts = layouts or []
        self.residuals: dict[str, np.ndarray] = {}
        self.previous: dict[str, np.ndarray] | None = None
        self._reset_step()

    def _reset_step(self) -> None:
        self.grads: dict[str, np.ndarray] = {}
        self.pending: dict[str, np.ndarray] | None = None
        self.kept: dict[str, Any] = {}
        self.kept_uses: dict[str, int] = {}
        self.results: dict[str, np.ndarray] = {}
        self.records: list[tuple] = []
        self.flagged: set[tuple[str, int]] = set()
        self.nonfinite: list[NonFiniteReport] = []
        self.keep_previous = False

    # -- an iteration --------------------------------------------------------
    def load(self, step: int, grads: dict[str, np.ndarray] | None, flagged: Any = None,
             keep_previous: bool = False) -> float:
        """Receive this worker's flat bucket gradients for ``step`` (zero-copy views of the object store).

        ``flagged``: the (bucket, partition) pairs holding NaN/Inf as the driver's scan found them; None
        when the driver has not seen the gradients (they came as an ObjectRef): then this actor scans.
        """
        start = time.time()
        self._reset_step()
        self.previous = None
        self.grads = grads or {}
        if flagged is None and self.grads and Actor.parse(self.name).is_worker:
            self.nonfinite, self.flagged = scan_worker(self.layouts, Actor.parse(self.name).index, self.grads)
        else:
            self.flagged = set(flagged or ())
        self.keep_previous = keep_previous
        self.pending = dict(self.residuals)
        self.records.append(("load", "", -1, start, time.time(), sum(g.nbytes for g in self.grads.values()), "", 0.0))
        return start

    def run(self, step: int, task_id: int, n_after: int, *args: Any) -> Any:
        """Execute fused task ``task_id``; returns its outgoing payloads, then a completion token."""
        task = self.tasks[task_id]
        values: dict[str, Any] = dict(zip(task.remote_inputs, args[n_after:]))
        for node in task.local_inputs:
            values[node] = self.kept[node]
            self.kept_uses[node] -= 1
            if self.kept_uses[node] == 0:
                del self.kept[node], self.kept_uses[node]
        for s in task.steps:
            a = s.attrs
            local = None
            if a.get("local_input"):
                start, stop = self.partitions[a["bucket"]][a["part"]]
                local = self.grads[a["bucket"]][start:stop]
            t0, cpu0 = time.time(), time.thread_time()
            result = run_node(a, [values[u] for u in s.inputs], local, codecs=self.codecs, residuals=self.pending,
                              plan_seed=self.plan_seed, step=step, flagged=self.flagged)
            # wall time, and this thread's CPU time (the op's own work, without waiting for a core)
            self.records.append((a["op"], a["bucket"], a["part"], t0, time.time(), a["nbytes"], s.node,
                                 time.thread_time() - cpu0))
            values[s.node] = result
            if a.get("output"):
                self._write_result(a["bucket"], a["part"], result)
        for node, uses in task.keep.items():
            self.kept[node] = values[node]
            self.kept_uses[node] = uses
        outputs = [values[n] for n in task.outputs]
        return (*outputs, task_id) if outputs else task_id

    def _write_result(self, tensor: str, part: int, value: np.ndarray) -> None:
        parts = self.partitions[tensor]
        buffer = self.results.get(tensor)
        if buffer is None:
            buffer = self.results[tensor] = np.empty(parts[-1][1], dtype=np.float32)
        start, stop = parts[part]
        buffer[start:stop] = value

    def collect(self, step: int, *tokens: Any) -> tuple[dict[str, np.ndarray], list[tuple], list[NonFiniteReport]]:
        """After every task of the step (the tokens): commit residuals, hand back results, op records and
        what this actor's own gradient scan found."""
        if self.pending is not None:
            if self.keep_previous:
                self.previous = self.residuals
            self.residuals = self.pending
        results, records, nonfinite = self.results, self.records, self.nonfinite
        self._reset_step()
        return results, records, nonfinite

    def rollback(self) -> None:
        """Undo the last collected step's residual updates (the driver voided that step)."""
        if self.previous is not None:
            self.residuals, self.previous = self.previous, None

    def discard(self) -> None:
        """Drop a half-finished step (after a failure elsewhere): residuals stay as last committed."""
        self._reset_step()

    # -- state ---------------------------------------------------------------------
    def get_residuals(self) -> dict[str, np.ndarray]:
        return self.residuals

    def set_residuals(self, residuals: dict[str, np.ndarray]) -> None:
        self.residuals = {k: np.array(v, dtype=np.float32, copy=True) for k, v in residuals.items()}


RemoteSyncActor = ray.remote(SyncActor)
