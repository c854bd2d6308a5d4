"""One rank's share of a plan, step after step, inside a torch.distributed process.

:class:`PlanRunner` hosts the per-rank executor (:class:`~casync.engines.executor.RankExecutor`, the one the
Ray actors use) on casync's own process group: :meth:`~PlanRunner.begin` opens a step,
:meth:`~PlanRunner.provide` hands over a bucket's gradient as soon as backward has produced it (that bucket's
encodes and transfers start while backward continues), :meth:`~PlanRunner.run` runs the step's ops to the end
(callers run it on a :class:`Background` thread, so backward goes on meanwhile).  The rank's error-feedback
residuals are committed by :meth:`~PlanRunner.commit` only, so a failed or voided step leaves them as they
were.  NaN/Inf are scanned per bucket as it is provided; under ``nonfinite="skip"`` or ``"raise"`` every rank
votes, so all of them void the same steps.  The consistency guard lives here too: every rank's plan
fingerprint and parameter CRC are compared on the control group.
"""
from __future__ import annotations

import hashlib
import json
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..engines.executor import RankExecutor
from ..engines.in_place import results_over_gradients
from ..engines.lanes import Lane
from ..engines.nonfinite import GradientScan, NonFiniteReport, layouts
from ..errors import NonFiniteGradientError, PlanMismatchError, ReplicaMismatchError, SyncError, SyncTimeoutError
from ..plan.syncplan import SyncPlan
from ..schedule import SECOND_PLAN_TRANSFERS, actor_shares
from ..transport.torchdist import as_sync_error
from .group import CasyncGroup


def plan_fingerprint(plan: SyncPlan, config: Mapping[str, Any] | None = None) -> str:
    """A hash of everything that decides what a plan does (the planner's timing notes left out), plus the
    configuration the rank asked for: ranks that would run different syncs get different fingerprints."""
    data = plan.to_dict()
    if "planner" in data["options"]:
        planner = dict(data["options"]["planner"] or {})
        planner.pop("seconds", None)
        data["options"] = dict(data["options"], planner=planner)
    text = json.dumps({"plan": data, "config": dict(config or {})}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_same_plan(group: CasyncGroup, fingerprint: str, describe: str, step: int | None = None) -> None:
    """Every rank's plan fingerprint (and ``step``, the steps done) must be the same; raises
    :class:`PlanMismatchError` on every rank."""
    seen = group.gather_object((fingerprint, describe, step), "comparing the ranks' plans")
    if len({f for f, _, _ in seen}) > 1:
        lines = "; ".join(f"rank {r}: {f} ({d})" for r, (f, d, _) in enumerate(seen))
        raise PlanMismatchError(f"the ranks built different sync plans, so their transfers would not match: {lines}. "
                                "Every rank must pass the same strategy, codec and options and have the same "
                                "model and gradient buckets")
    if len({s for _, _, s in seen}) > 1:
        lines = ", ".join(f"rank {r} {s}" for r, (_, _, s) in enumerate(seen))
        raise PlanMismatchError(f"the ranks are at different steps ({lines}), so their codec seeds and transfers "
                                "would not match: every rank must load the same casync state dict, or none")


def check_same_settings(group: CasyncGroup, settings: dict[str, Any]) -> None:
    """Every rank's ``settings`` must be the same; raises :class:`PlanMismatchError` on every rank naming each
    setting that differs."""
    seen = group.gather_object(settings, "comparing the ranks' casync settings")
    differ = {key: [s.get(key) for s in seen] for key in sorted({k for s in seen for k in s})
              if len({repr(s.get(key)) for s in seen}) > 1}
    if differ:
        lines = "; ".join(f"{key}: " + ", ".join(f"rank {r} {v!r}" for r, v in enumerate(values))
                          for key, values in differ.items())
        raise PlanMismatchError(f"the ranks set casync up differently ({lines}); every rank must pass the same "
                                "settings and load the same casync state dict (or none)")


def parameters_crc(tensors: Iterable[Any]) -> int:
    """CRC-32 of parameter values in the given order (as the Trainer's replica check computes it)."""
    import torch

    crc = 0
    for t in tensors:
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # any dtype (bf16 has no NumPy twin)
        crc = zlib.crc32(raw.numpy(), crc)
    return crc


def check_replicas(group: CasyncGroup, crc: int | None, step: int) -> None:
    """Every rank's parameter CRC must agree; raises :class:`ReplicaMismatchError` on every rank.  ``crc`` None:
    this rank took no step to compare (joined under DDP's ``join()``: out of inputs, it keeps the parameters it
    had, and DDP hands it the final model when the join ends)."""
    seen = group.gather_object(crc, f"comparing parameters at step {step}")
    taken = [c for c in seen if c is not None]
    if len(set(taken)) <= 1:
        return
    counts = sorted(((taken.count(c), c) for c in set(taken)), reverse=True)
    if counts[0][0] > counts[1][0]:  # a majority: the others drifted from it
        odd = [r for r, c in enumerate(seen) if c is not None and c != counts[0][1]]
        blame = f"rank(s) {odd} drifted from the others"
    else:
        blame = "no majority to say which rank(s) drifted"
    joined = [r for r, c in enumerate(seen) if c is None]
    aside = f" (rank(s) {joined} joined, not compared)" if joined else ""
    raise ReplicaMismatchError(f"step {step}: the replicas' parameters differ (CRC-32 per rank {seen}{aside}); "
                               f"{blame}. Parameters must be equal at start (broadcast them from rank 0) and every "
                               "rank must apply the same update")


@dataclass
class StepOutcome:
    """What a finished step produced on this rank."""

    step: int
    results: dict[str, np.ndarray]  # bucket -> flat float32 result (the runner's buffers: valid until the next step)
    residuals: dict[str, np.ndarray]  # the residuals to commit (this rank's keys)
    skipped: bool = False
    nonfinite: list[NonFiniteReport] = field(default_factory=list)
    records: list[tuple] = field(default_factory=list)
    sent_bytes: int = 0
    raw_bytes: int = 0
    full: bool = False  # synced uncompressed (the plan's lossless twin)


class Background:
    """Runs ``fn()`` on a daemon thread, or on ``lane`` (a long-lived one: starting a thread waits until it runs, a
    millisecond or more on busy cores, and the hook starts a step from backward's own thread); :meth:`result`
    waits for it and returns its value or raises its error."""

    def __init__(self, fn: Callable[[], Any], name: str, lane: Lane | None = None):
        self._fn, self._value, self._error, self._name = fn, None, None, name
        self.finished = threading.Event()
        if lane is not None:
            lane.run(self._main)
        else:
            threading.Thread(target=self._main, daemon=True, name=name).start()

    def _main(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:
            self._error = exc
        finally:
            self.finished.set()

    def result(self, timeout_s: float) -> Any:
        if not self.finished.wait(timeout_s):
            raise SyncTimeoutError(f"{self._name}: not finished within {timeout_s:.0f}s")
        if self._error is not None:
            raise self._error
        return self._value


class PlanRunner:
    """Runs the share of ``actor`` (default ``worker:<rank>``) of ``plan`` over ``group``, one step at a time."""

    def __init__(self, plan: SyncPlan, group: CasyncGroup, actors: list[str] | None = None, compute_threads: int = 1,
                 *, full_plan: SyncPlan | None = None):
        plan.require_executable("casync.torch")
        self.plan = plan
        self.group = group
        names = actors if actors is not None else [f"worker:{r}" for r in range(group.world)]
        self.actor = names[group.rank]
        self.rank = int(self.actor.split(":")[1]) if self.actor.startswith("worker:") else -1
        share = actor_shares(plan)[self.actor]
        partitions = {b.name: list(b.partitions) for b in plan.buckets}
        channel = group.channel(plan, names)
        scan = GradientScan.of(self.rank, layouts(plan)) if self.rank >= 0 else None
        self.executor = RankExecutor(share, plan.codecs, plan.seed, partitions, channel, group.timeout_s,
                                     compute_threads=compute_threads,
                                     overwritable=results_over_gradients(plan, self.actor), scan=scan)
        # full-precision steps (CD-SGD's) run the plan's uncompressed twin on the same channel, as the Trainer's do
        self.full_executor: RankExecutor | None = None
        if full_plan is not None:
            full_plan.require_executable("casync.torch")
            self.full_executor = RankExecutor(actor_shares(full_plan, SECOND_PLAN_TRANSFERS)[self.actor],
                                              dict(plan.codecs, **full_plan.codecs), plan.seed, partitions, channel,
                                              group.timeout_s, compute_threads=compute_threads, scan=scan)
        self._running = self.executor  # the executor of the open (or last) step
        self.full = False  # whether the open (or last) step is a full-precision one
        # the steps' result buffers, reused: every caller copies a step's results away before the next begins
        # (the hook into DDP's buckets, the optimizer into .grad, TorchDistEngine down its pipe)
        self.out = self.executor.new_result_buffers()
        self.residuals: dict[str, np.ndarray] = {}
        self.spares: dict[str, np.ndarray] = {}  # the residuals a commit replaced: the next step writes there
        self.owned = {a["ef_key"] for _, a in plan.graph.nodes(data=True)
                      if a["op"] == "encode" and a["ef"] and a["actor"] == self.actor}
        self.step: int | None = None  # the open step
        self.broken: BaseException | None = None
        self._lane: Lane | None = None

    @property
    def lane(self) -> Lane:
        """A long-lived thread for the callers' background work (each step's :meth:`run`), started on first use
        and stopped by :meth:`close`."""
        if self._lane is None:
            self._lane = Lane(f"casync-steps-{self.actor}")
        return self._lane

    # -- a step ------------------------------------------------------------------------------------------------
    def begin(self, step: int, full: bool = False, codecs: Mapping[str, Any] | None = None) -> None:
        """Open ``step``: post its receives (its transfers can arrive from now on).  ``full``: sync it with the
        uncompressed twin (``full_plan``; the residuals stay as they are); ``codecs``: this step's codec objects by
        key where they differ from the plan's (DGC's sparsity warm-up; every rank passes the same)."""
        self._check_usable()
        if self.step is not None:
            raise SyncError(f"{self.actor}: step {step} begun while step {self.step} is still open")
        if full and self.full_executor is None:
            raise SyncError(f"{self.actor}: step {step} is a full-precision one but the runner has no full_plan")
        executor = self.full_executor if full else self.executor
        try:
            self._running, self.full = executor, full
            executor.begin(step, self.residuals, None if full else codecs, out=self.out, spares=self.spares)
        except BaseException as exc:
            self.broken = as_sync_error(exc, f"{self.actor}, step {step}")
            raise self.broken from exc
        self.step = step

    def provide(self, bucket: str, flat: np.ndarray, results_here: bool = False) -> None:
        """This rank's gradient of plan bucket ``bucket`` (flat float32, read until the step ends);
        ``results_here``: the step's results of the bucket are written into ``flat`` (see
        ``RankExecutor.provide``; for the buckets in :attr:`overwritable`).  The executor's ops scan it for
        NaN/Inf as they first read each partition."""
        self._running.provide(bucket, flat, None, results_here)

    @property
    def overwritable(self) -> frozenset[str]:
        """The plan buckets whose results may be written over their gradient (``provide(results_here=True)``)."""
        return self.executor.overwritable

    def run(self, vote: bool = True) -> StepOutcome:
        """Run the open step's ops to the end in this thread (they start once :meth:`provide` hands their
        buckets over).  A failure raises a :class:`~casync.errors.SyncError` subclass and leaves the runner
        unusable.  Under ``nonfinite="skip"``/``"raise"``, with ``vote``, every rank learns whether any rank's
        gradient held NaN/Inf (one small all-reduce on the control group): ``"skip"`` voids the step on all of
        them (zeros, residuals kept), ``"raise"`` raises :class:`~casync.errors.NonFiniteGradientError` on all
        of them (nothing changed)."""
        if self.step is None:
            raise SyncError(f"{self.actor}: no step is open")
        step, self.step = self.step, None
        executor = self._running
        try:
            results, residuals, records = executor.finish()
        except BaseException as exc:
            self.broken = as_sync_error(exc, f"{self.actor}, step {step}")
            raise self.broken from exc
        if self.full:  # the twin has no error feedback: the residuals are kept for the next compressed step
            residuals = self.residuals
        reports = list(executor.nonfinite)
        outcome = StepOutcome(step, results, residuals, records=records, nonfinite=reports,
                              sent_bytes=executor.sent_bytes, raw_bytes=executor.raw_bytes, full=self.full)
        mode = self.plan.nonfinite
        if vote and mode != "propagate":
            flagged = self.group.all_sum(len(reports), f"step {step}: voting on NaN/Inf")
            if flagged:
                everyone = self.group.gather_object(reports, f"step {step}: gathering NaN/Inf reports")
                outcome.nonfinite = [r for found in everyone for r in found]
                if mode == "raise":
                    raise NonFiniteGradientError(outcome.nonfinite, step)
                outcome.skipped = True
                outcome.residuals = self.residuals
                outcome.results = {b: np.zeros_like(r) for b, r in results.items()}
        return outcome

    def commit(self, outcome: StepOutcome) -> None:
        """Keep the residuals of a step that was applied (the ones they replace become the next step's spares:
        nothing else holds them, ``state_dict`` copies)."""
        if outcome.residuals is not self.residuals:
            self.spares, self.residuals = self.residuals, outcome.residuals

    # -- state -------------------------------------------------------------------------------------------------
    def set_residuals(self, residuals: Mapping[str, np.ndarray]) -> None:
        """Restore this rank's residuals (keys this rank's encodes own; checked)."""
        unknown = sorted(set(residuals) - self.owned)
        if unknown:
            raise ValueError(f"{self.actor}: residuals {unknown[:4]} belong to no encode of this rank")
        self.residuals = {k: np.array(v, dtype=np.float32, copy=True) for k, v in residuals.items()}
        self.spares = {}

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise SyncError(f"{self.actor}: this synchronizer failed earlier ({self.broken}); start a new one from "
                            "the last checkpoint") from self.broken

    def abort(self, exc: BaseException) -> None:
        """Fail the step in flight with ``exc`` (its caller gave up on it, say a hook that raised on this rank):
        its threads stop, the peers waiting for this rank are told, and :meth:`run` raises.  Nothing when no
        step is in flight."""
        self._running.abort(exc)

    def close(self) -> None:
        """Stop the lane; nothing else to release beyond the group (its owner closes it); a failed runner stays
        unusable."""
        self.broken = self.broken or SyncError(f"{self.actor}: closed")
        if self._lane is not None:
            self._lane.stop()
