"""Driver side of a Trainer on Ray: start the worker (and PS server) actors (or restart them for a new run), form
their process group, submit training steps, map failures to typed errors, keep the measured timeline.

A step is a few calls per actor: every worker's ``train_step`` (its buckets go to its per-rank executor as
backward fills them; payloads go actor to actor over the group), every actor's ``finish`` and every worker's
``apply``.  The driver fetches only small per-step statistics.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayTaskError

from casync.primitives.ir import Actor

from ..engines.nonfinite import layouts
from ..engines.timeline import TimelineBuffer, op_rows
from ..errors import SyncError
from ..plan.syncplan import SyncPlan
from ..runtime.data_plane import form_group
from ..runtime.ray_layer import DEFAULT_CPUS_PER_ACTOR, ActorGroup, connect_ray
from ..schedule import SECOND_PLAN_TRANSFERS, actor_shares
from .dgc import step_codecs
from .options import TrainOptions
from .step_sync import SYNC_GROUP, StepSyncActor
from .worker import TrainWorker


@dataclass
class StepRefs:
    """The refs of one submitted step (and, once fetched, its per-worker compute statistics)."""

    step: int
    full: bool
    train: dict[str, Any]  # worker -> train_step ref
    finish: dict[str, Any]  # actor -> finish ref
    nonfinite: dict[str, Any] = field(default_factory=dict)  # worker -> ref of its NaN/Inf reports
    stats: dict[str, dict] = field(default_factory=dict)  # worker -> train_step result
    recorded: bool = False
    wall: float = float("nan")  # driver seconds of the iteration that computed this step


class TrainEngine:
    """The actors of one Trainer and the submission of its steps."""

    def __init__(self, plan: SyncPlan, full_plan: SyncPlan | None, layout: list, fns: tuple, options: TrainOptions,
                 warmup: dict, address: str | None):
        self._set_run(plan, full_plan, options, warmup)
        cpus = self._cpus(plan, options)
        self.group = ActorGroup(address, options.timeout_s, ping="ready", on_fail=self._discard,
                                num_cpus=max(os.cpu_count() or 1, math.ceil(sum(cpus))))
        try:
            self._start_actors(cpus, layout, fns)
        except BaseException:
            self.close()
            raise

    def _set_run(self, plan: SyncPlan, full_plan: SyncPlan | None, options: TrainOptions, warmup: dict) -> None:
        """Take ``plan`` (and its full-precision twin) and ``options`` as this engine's run, with an empty timeline."""
        self.plan = plan
        self.options = options
        self.full_plan = full_plan
        self.warmup = warmup
        self.codecs = dict(plan.codecs, **(full_plan.codecs if full_plan else {}))
        self.workers = [f"worker:{w}" for w in range(plan.workers)]
        self._timeline = TimelineBuffer()
        self._send_of = {n: next(iter(plan.graph.predecessors(n))) for n in plan.nodes(op="recv")}

    @staticmethod
    def _cpus(plan: SyncPlan, options: TrainOptions) -> list[float]:
        """The CPUs each actor of ``plan`` reserves (its placement-group bundle)."""
        return [options.cpus_per_worker if Actor.parse(a).is_worker else DEFAULT_CPUS_PER_ACTOR for a in plan.actors]

    @property
    def actors(self) -> dict[str, Any]:
        return self.group.handles

    # -- lifecycle -----------------------------------------------------------------------
    def _start_actors(self, cpus: list[float], layout: list, fns: tuple) -> None:
        self.group.place(cpus, self.options.placement, hint="lower cpus_per_worker or add nodes", owner="Trainer")
        # Ray threads that only wait: finish() of a step while the next one computes
        worker_cls = ray.remote(concurrency_groups={SYNC_GROUP: 4})(TrainWorker)
        server_cls = ray.remote(concurrency_groups={SYNC_GROUP: 4})(StepSyncActor)
        for index, (name, args) in enumerate(self._actor_args(layout, fns).items()):
            remote_cls = worker_cls if Actor.parse(name).is_worker else server_cls
            self.group.start(name, remote_cls, index, cpus[index], *args)
        self._form_data_plane()

    def _actor_args(self, layout: list, fns: tuple) -> dict[str, tuple]:
        """Each actor's constructor arguments for this engine's run (``TrainWorker``'s or ``StepSyncActor``'s)."""
        partitions = {b.name: list(b.partitions) for b in self.plan.buckets}
        shares = actor_shares(self.plan)
        full_shares = actor_shares(self.full_plan, SECOND_PLAN_TRANSFERS) if self.full_plan else {}
        out = {}
        for name in self.plan.actors:
            mine = {False: shares[name], **({True: full_shares[name]} if name in full_shares else {})}
            actor = Actor.parse(name)
            if actor.is_worker:
                out[name] = (name, actor.index, self.plan.workers, mine, self.codecs, self.plan.seed, partitions, layout,
                             fns, self.options, self.warmup, layouts(self.plan), self.plan.nonfinite)
            else:
                out[name] = (name, mine, self.codecs, self.plan.seed, partitions, self.options.timeout_s,
                             self.options.compute_threads)
        return out

    def _form_data_plane(self) -> None:
        """Wait for every actor's set-up (model_fn and data_fn on the workers), then connect them for the run's
        plans (``casync.runtime.data_plane``)."""
        self.get([a.ready.remote() for a in self.actors.values()], "starting the workers (model_fn, data_fn)")
        plans = [(self.plan, 0)] + ([(self.full_plan, SECOND_PLAN_TRANSFERS)] if self.full_plan else [])
        self.interfaces = form_group(self.actors, plans, self.options.transport, {}, self.get)

    def restart(self, plan: SyncPlan, full_plan: SyncPlan | None, layout: list, fns: tuple, options: TrainOptions,
                warmup: dict, address: str | None) -> None:
        """Run a new training run on the actors already running (``Trainer.restart``): each process drops its run
        and sets up as a fresh actor with these arguments would, and the data plane is formed afresh.

        Refused before anything changes: a closed or failed engine (:class:`SyncError`), Ray shut down meanwhile
        (:class:`SyncError`), an ``address`` of another cluster than this process runs on (``ValueError``), other
        actors (``plan.actors``: as many workers and servers) or another placement (``cpus_per_worker``,
        ``placement``), both ``ValueError``, and a dead actor (:class:`casync.WorkerLostError`).  A failure after
        that (a worker's model_fn or data_fn raising, a fault while the data plane forms) leaves the engine
        unusable, like a failed step."""
        self.check_usable()
        if not ray.is_initialized():
            raise SyncError("Ray was shut down since this Trainer started: its actors are gone; build a new Trainer")
        connect_ray(address)  # Ray is up: only refuses an address naming another cluster, as Trainer(...) would
        if list(plan.actors) != list(self.plan.actors):
            raise ValueError(f"restart runs on the same actors: this trainer has {', '.join(self.plan.actors)}, the "
                             f"new run needs {', '.join(plan.actors)} (another worker or server count); build a new "
                             "Trainer for it")
        for name in ("cpus_per_worker", "placement"):
            old, new = getattr(self.options, name), getattr(options, name)
            if old != new:
                raise ValueError(f"restart keeps the actors where they were placed: {name}={new!r} differs from "
                                 f"this trainer's {old!r}; build a new Trainer for it")
        self.get([a.pid.remote() for a in self.actors.values()], "checking the actors before restarting")
        self._set_run(plan, full_plan, options, warmup)
        self.group.timeout_s = float(options.timeout_s)
        args = self._actor_args(layout, fns)
        self.get([self.actors[name].restart.remote(*args[name]) for name in plan.actors], "restarting the actors")
        self._form_data_plane()

    def start_at(self, step: int) -> None:
        """The step the actors' sync threads take next (after restoring a checkpoint)."""
        self.get([a.start_at.remote(step) for a in self.actors.values()], "restoring the step")

    def close(self) -> None:
        """Kill the actors and free the placement group; stop Ray if this engine started it."""
        self.group.close()

    def check_usable(self) -> None:
        self.group.check_usable("Trainer", "build a new one with Trainer.load() from the last checkpoint")

    # -- steps -------------------------------------------------------------------------------
    def start_step(self, step: int, full: bool) -> StepRefs:
        """Submit one step: every worker's forward and backward (its buckets go to its sync as they fill), every
        server's share, and every actor's finish (its sync ends).  Actors synchronize steps in order."""
        train = {w: self.actors[w].train_step.remote(step, full) for w in self.workers}
        codecs, _ = step_codecs(step, full, self.codecs, self.warmup, self.options.warmup_start_ratio,
                                self.options.warmup_steps)
        for name in self.actors:
            if name not in train:  # a PS server
                self.actors[name].begin.remote(step, full, codecs)
        finished = {a: self.actors[a].finish.remote(step) for a in self.actors}
        return StepRefs(step=step, full=full, train=train, finish={a: f[0] for a, f in finished.items()},
                        nonfinite={w: finished[w][1] for w in self.workers})

    def apply(self, refs: StepRefs, after: dict[str, Any], check: bool) -> dict[str, Any]:
        """Submit every worker's optimizer step for ``refs``' step, after ``after[worker]`` (a train_step).
        Each gets every worker's NaN/Inf reports of the step, so all of them void it or none."""
        reports = [refs.nonfinite[w] for w in self.workers if w in refs.nonfinite]
        return {w: self.actors[w].apply.remote(refs.step, check, len(reports), *reports,
                                               *([refs.finish[w]] if w in refs.finish else []), after[w])
                for w in self.workers}

    def call(self, method: str, *args: Any, actors: list[str] | None = None) -> list[Any]:
        """Call ``method`` on each actor (default: every worker) and wait for the results."""
        names = actors if actors is not None else self.workers
        return self.get([getattr(self.actors[n], method).remote(*args) for n in names], f"calling {method}")

    def get(self, refs: list[Any], what: str, deadline: float | None = None) -> list[Any]:
        """``ray.get`` with this engine's timeout; failures become typed errors and make the engine unusable.
        An exception raised in user code (model_fn, loss_fn, data_fn) is re-raised as its own type."""
        try:
            return self.group.get(refs, what, deadline)
        except RayTaskError as exc:
            self.group.fail(f"a task failed while {what}: {type(exc.cause).__name__}: {exc.cause}"[:300])
            if isinstance(exc.cause, SyncError):
                raise type(exc.cause)(f"{what}: {exc.cause}") from exc
            raise exc.as_instanceof_cause() from None

    def _discard(self, reason: str) -> None:
        for handle in self.actors.values():
            try:
                handle.discard.remote(reason)
            except Exception:
                pass

    # -- timeline ------------------------------------------------------------------------------
    def record(self, step: int, records: dict[str, list[tuple]]) -> None:
        self._timeline.add(step, op_rows(step, records, self._send_of))

    def timeline(self, step: int | None = None) -> list[dict[str, Any]]:
        return self._timeline.rows(step)
