"""Driver side of a Trainer on Ray: start the worker (and PS server) actors, submit training steps, map
failures to typed errors, keep the measured timeline.

A step is submitted whole: every worker's ``train_step``, every fused sync task of the plan (ObjectRefs
of payloads go actor to actor, never through the driver), every actor's ``finish`` and every worker's
``apply``.  The driver fetches only small per-step statistics.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayTaskError

from primitives.ir import Actor

from ..engines.nonfinite import layouts
from ..engines.timeline import TimelineBuffer, op_rows
from ..errors import SyncError
from ..plan.syncplan import SyncPlan
from ..runtime.ray_engine import submit_iteration
from ..runtime.ray_layer import DEFAULT_CPUS_PER_ACTOR, ActorGroup
from ..schedule import Program, compile_program
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


def offset_program(program: Program, by: int) -> Program:
    """The same program with task ids shifted by ``by`` (two programs then share one actor's task table)."""
    tasks = [dataclasses.replace(t, id=t.id + by, after=[i + by for i in t.after]) for t in program.tasks]
    return Program(tasks=tasks, producer={n: (i + by, k) for n, (i, k) in program.producer.items()})


class TrainEngine:
    """The actors of one Trainer and the submission of its steps."""

    def __init__(self, plan: SyncPlan, full_plan: SyncPlan | None, layout: list, fns: tuple, options: TrainOptions,
                 warmup: dict, address: str | None):
        self.plan = plan
        self.options = options
        self.program = compile_program(plan)
        self.full_program = offset_program(compile_program(full_plan), len(self.program.tasks)) if full_plan else None
        self.codecs = dict(plan.codecs, **(full_plan.codecs if full_plan else {}))
        self.workers = [f"worker:{w}" for w in range(plan.workers)]
        self._timeline = TimelineBuffer()
        self._send_of = {n: next(iter(plan.graph.predecessors(n))) for n in plan.nodes(op="recv")}
        cpus = [options.cpus_per_worker if Actor.parse(a).is_worker else DEFAULT_CPUS_PER_ACTOR for a in plan.actors]
        self.group = ActorGroup(address, options.timeout_s, ping="ready", on_fail=self._discard,
                                num_cpus=max(os.cpu_count() or 1, math.ceil(sum(cpus))))
        try:
            self._start_actors(cpus, layout, fns, warmup)
        except BaseException:
            self.close()
            raise

    @property
    def actors(self) -> dict[str, Any]:
        return self.group.handles

    # -- lifecycle -----------------------------------------------------------------------
    def _start_actors(self, cpus: list[float], layout: list, fns: tuple, warmup: dict) -> None:
        names = self.plan.actors
        self.group.place(cpus, self.options.placement, hint="lower cpus_per_worker or add nodes")
        partitions = {b.name: list(b.partitions) for b in self.plan.buckets}
        per_actor = max(len(self.program.tasks_of(n)) for n in names)
        threads = min(256, 2 * per_actor * (2 if self.full_program else 1) + 8)  # waiting tasks, two steps in flight
        worker_cls = ray.remote(concurrency_groups={SYNC_GROUP: threads})(TrainWorker)
        server_cls = ray.remote(concurrency_groups={SYNC_GROUP: threads})(StepSyncActor)
        for index, name in enumerate(names):
            tasks = self.program.tasks_of(name) + (self.full_program.tasks_of(name) if self.full_program else [])
            actor = Actor.parse(name)
            if actor.is_worker:
                self.group.start(name, worker_cls, index, cpus[index], name, actor.index, self.plan.workers, tasks,
                                 self.codecs, self.plan.seed, partitions, layout, fns, self.options, warmup,
                                 layouts(self.plan), self.plan.nonfinite, allow_out_of_order_execution=True)
            else:
                self.group.start(name, server_cls, index, cpus[index], name, tasks, self.codecs, self.plan.seed,
                                 partitions, self.options.timeout_s, allow_out_of_order_execution=True)
        self.get([a.ready.remote() for a in self.actors.values()], "starting the workers (model_fn, data_fn)")

    def close(self) -> None:
        """Kill the actors and free the placement group; stop Ray if this engine started it."""
        self.group.close()

    def check_usable(self) -> None:
        self.group.check_usable("Trainer", "build a new one with Trainer.load() from the last checkpoint")

    # -- steps -------------------------------------------------------------------------------
    def start_step(self, step: int, full: bool, after: dict[str, Any] | None = None) -> StepRefs:
        """Submit one step's compute and sync; ``after``: refs (per actor) its sync must wait for."""
        program = self.full_program if full else self.program
        train = {w: self.actors[w].train_step.remote(step, full) for w in self.workers}
        leading: dict[str, list[Any]] = {a: [after[a]] for a in self.actors} if after else {}
        for name in self.actors:
            if name not in train:  # a PS server: opens the step once the previous one is done
                leading[name] = [self.actors[name].begin.remote(step, *leading.get(name, []))]
        tokens = submit_iteration(program, self.actors, step, leading)
        finished = {a: self.actors[a].finish.remote(step, *tokens[a]) for a in self.actors}
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
