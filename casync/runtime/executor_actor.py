"""The Ray actor of the direct data plane: one actor's share of a plan on a per-rank executor, one call a step.

Payloads go actor to actor over the data plane (``casync.runtime.data_plane``: shared memory and Unix sockets on
one machine, a torch.distributed process group between machines); Ray only starts the actors, hands each its
gradients and takes back its results.
Residuals of a step are committed when the step ends; with ``keep_previous`` the state before it is kept,
so the driver can roll back a step it voids after the fact (NaN/Inf found by an actor's own scan).
"""
from __future__ import annotations

import sys
import time
from typing import Any, Iterable

import numpy as np
import ray

from casync.primitives.codecs import Codec
from casync.primitives.codecs.dense import FP16Codec
from casync.primitives.ir import Actor

from ..engines.executor import RankExecutor
from ..engines.memory import keep_freed_memory
from ..engines.nonfinite import BucketLayout, GradientScan, NonFiniteReport
from ..schedule import ActorShare
from .data_plane import DataPlaneMember
from .shared_results import NoRoomError, SharedResults, room_for


def load_torch_casts(codecs: Iterable[Codec]) -> bool:
    """Import PyTorch where one of ``codecs`` is fp16 and torch is installed, so fp16's casts
    (``casync.primitives.codecs.dense.cast``) take PyTorch's F16C kernels, a tenth of NumPy's time, in an actor that has
    no other use for torch (on one machine the data plane needs none); a torch this call imports runs on one
    thread, one op on one core like the rest of the ops.  Returns whether torch is loaded."""
    if "torch" in sys.modules:
        return True
    if not any(isinstance(c, FP16Codec) for c in codecs):
        return False
    try:
        import torch
    except ImportError:
        return False
    torch.set_num_threads(1)
    return True


class ExecutorActor(DataPlaneMember):
    """Hosts :class:`~casync.engines.executor.RankExecutor` for one actor of a plan."""

    def __init__(self, name: str, share: ActorShare, codecs: dict, plan_seed: int,
                 partitions: dict[str, list[tuple[int, int]]], layouts: list[BucketLayout], timeout_s: float,
                 compute_threads: int = 1):
        keep_freed_memory()
        self.timeout_s = timeout_s
        self.compute_threads = compute_threads
        self.shared: SharedResults | None = None
        self._take_role(name, share, codecs, plan_seed, partitions, layouts)

    def _take_role(self, name: str, share: ActorShare, codecs: dict, plan_seed: int,
                   partitions: dict[str, list[tuple[int, int]]], layouts: list[BucketLayout]) -> None:
        """Become actor ``name`` of a plan, with no state of an earlier one: no residuals, no executor yet (it
        comes with the data plane, ``_on_channel``), results on Ray's return until :meth:`share_results`."""
        load_torch_casts(codecs.values())
        self.name = name
        self.actor = Actor.parse(name)
        self.share, self.codecs, self.plan_seed, self.partitions = share, codecs, plan_seed, partitions
        self.layouts = layouts
        self.residuals: dict[str, np.ndarray] = {}
        self.previous: dict[str, np.ndarray] | None = None
        self.executor: RankExecutor | None = None
        # result buffers, reused step after step: Ray copies them on return, or the driver from shared memory
        self.out: dict[str, np.ndarray] = {}
        self.spares: dict[str, np.ndarray] = {}  # residuals no longer held: a step writes its new ones there

    def replan(self, name: str, share: ActorShare, codecs: dict, plan_seed: int,
               partitions: dict[str, list[tuple[int, int]]], layouts: list[BucketLayout]) -> None:
        """Drop the plan this actor runs (executor, residuals, results segment, data plane) and take the role
        ``name`` of a new one; the driver then forms the new data plane (``RayEngine.replan``).  The process,
        its placement, its timeout and compute threads stay."""
        shared, self.shared = self.shared, None
        self.executor, self.out, self.residuals, self.previous, self.spares = None, {}, {}, None, {}
        self.leave()  # collects the old executor first: nothing holds a view of its arenas or results after
        if shared is not None:
            shared.buffers = {}
            shared.shm.close()  # its name was unlinked when the driver mapped it: this frees the memory
        self._take_role(name, share, codecs, plan_seed, partitions, layouts)

    def _on_channel(self, channel: Any) -> None:
        scan = GradientScan.of(self.actor.index, self.layouts) if self.actor.is_worker else None
        self.executor = RankExecutor(self.share, self.codecs, self.plan_seed, self.partitions, channel, self.timeout_s,
                                     compute_threads=self.compute_threads, scan=scan)
        self.out = self.executor.new_result_buffers()

    # -- a step ------------------------------------------------------------------------------------------------
    def run_step(self, step: int, grads: dict[str, np.ndarray] | None, flagged: Any = None,
                 keep_previous: bool = False) -> tuple[dict[str, np.ndarray] | None, list[tuple], list[NonFiniteReport]]:
        """Synchronize ``step``: this worker's flat bucket gradients in (None on a server), its results out
        (None when they are in shared memory: :meth:`share_results`).

        ``flagged``: the (bucket, partition) pairs holding NaN/Inf as the driver's scan found them; None when
        the driver has not seen the gradients (they came as an ObjectRef): then this actor's ops scan them,
        each partition as they first read it (``RankExecutor.scan``), and the step's reports come back."""
        start = time.time()
        grads = grads or {}
        executor = self.executor
        # the residuals kept to undo the last step are free once the next step begins (that step stands: a
        # voided one was rolled back before), so this step writes there instead of into fresh memory
        spares = self.previous if self.previous is not None else self.spares
        self.previous = None
        executor.begin(step, self.residuals, out=self.out, spares=spares)
        for bucket, flat in grads.items():
            executor.provide(bucket, flat, None if flagged is None else {f for f in flagged if f[0] == bucket})
        records = [("load", "", -1, start, time.time(), sum(g.nbytes for g in grads.values()), "", 0.0)]
        results, residuals, ops = executor.finish()
        reports = executor.nonfinite  # what its own scans found (none where the driver scanned)
        # what this step replaced is the next step's spares, or, kept for a rollback, its `previous` (nothing
        # else holds either: get_residuals hands out copies)
        self.spares = {} if keep_previous else self.residuals
        self.previous = self.residuals if keep_previous else None
        self.residuals = residuals
        return (None if self.shared is not None else results), records + ops, reports

    # -- results through shared memory -------------------------------------------------------------------------
    def share_results(self, name: str) -> bool:
        """Write results into shared memory named ``name`` from now on (the driver runs on this machine and
        maps it); False, leaving results on Ray's return, where there is no room for it."""
        sizes = {b: out.size for b, out in self.out.items()}
        if not room_for(4 * sum(sizes.values())):
            return False
        try:  # room_for saw the free space before the other actors of this machine took theirs
            self.shared = SharedResults(name, sizes)
        except NoRoomError:
            return False
        self.out = self.shared.buffers
        return True

    def unlink_results(self) -> None:
        """The driver has mapped the segment: remove its name."""
        if self.shared is not None:
            self.shared.unlink()

    def rollback(self) -> None:
        """Undo the last step's residual updates (the driver voided that step)."""
        if self.previous is not None:  # the voided step's residuals are free: the next step writes there
            self.residuals, self.previous, self.spares = self.previous, None, self.residuals

    def discard(self) -> None:
        """Nothing is half-done between calls: a failed step never committed its residuals."""

    # -- state and introspection ---------------------------------------------------------------------------------
    def get_residuals(self) -> dict[str, np.ndarray]:
        return dict(self.residuals)  # arrays: a deferred residual is computed here, not shipped as two parts

    def set_residuals(self, residuals: dict[str, np.ndarray]) -> None:
        self.residuals = {k: np.array(v, dtype=np.float32, copy=True) for k, v in residuals.items()}
        self.previous = None
        self.spares = {}


RemoteExecutorActor = ray.remote(ExecutorActor)
