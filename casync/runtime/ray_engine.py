"""``RayEngine``: run a plan on Ray actors — one per worker and per dedicated server.

Data planes (``transport=``):

* ``"direct"`` (default): the actors form a torch.distributed gloo process group and each runs its share of
  the plan on a per-rank executor (``casync.engines.executor``): payloads go actor to actor — through
  shared memory between actors on one node (``casync.transport.shm``), over the group between nodes — ops
  run priority-first with communication on their own threads, and Ray carries one call per actor per
  iteration (gradients in, results out).  ``"gloo"``: the same with every payload over gloo (TCP, also
  on one node); ``"nccl"``: over NCCL (GPUs); ``"tcp"``: as ``"direct"`` on each node, and plain TCP
  sockets between nodes instead of the process group (``casync.transport.sockets``; about half gloo's
  CPU per small message).
* ``"objectstore"``: every task of the schedule (one actor's ops of one bucket in one hop) is one Ray call,
  and payloads travel as ObjectRefs through Ray's object store.  A whole iteration is submitted at once;
  actors run tasks as their inputs arrive.  Kept to compare the two.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayTaskError

from ..engines.contract import EngineBase, fresh_results
from ..engines.inputs import check_compute_threads
from ..engines.inputs import check_flats
from ..engines.nonfinite import SyncOutput, layouts, scan_worker, void_step, voids_step
from ..engines.state import EngineState
from ..engines.timeline import op_rows
from ..errors import SyncError, WorkerLostError
from ..plan.syncplan import SyncPlan
from ..schedule import Program, actor_shares, compile_program
from .data_plane import form_group
from .executor_actor import RemoteExecutorActor
from .ray_actor import RemoteSyncActor
from .ray_layer import DEFAULT_CPUS_PER_ACTOR, ActorGroup, dead_actors, positive_number
from .shared_results import MappedResults

TRANSPORTS = ("direct", "tcp", "gloo", "nccl", "objectstore")
DEFAULT_TRANSPORT = "direct"


def submit_iteration(program: Program, actors: dict[str, Any], step: int,
                     leading: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Submit every fused task of one iteration in the program's order; returns each actor's completion refs.

    ``leading[actor]``: refs every task of that actor waits for (its gradient load, an earlier step's end).
    Payloads travel actor to actor as ObjectRefs; the caller never fetches them.
    """
    tokens: dict[str, list[Any]] = {name: list(leading.get(name, [])) for name in actors}
    outputs: dict[int, list[Any]] = {}
    task_token: dict[int, Any] = {}
    for task in program.tasks:
        lead = list(leading.get(task.actor, []))
        args = [task_token[i] for i in task.after] + lead
        args += [outputs[program.producer[u][0]][program.producer[u][1]] for u in task.remote_inputs]
        refs = actors[task.actor].run.options(num_returns=len(task.outputs) + 1).remote(
            step, task.id, len(task.after) + len(lead), *args)
        refs = refs if isinstance(refs, list) else [refs]
        outputs[task.id], task_token[task.id] = refs[:-1], refs[-1]
        tokens[task.actor].append(refs[-1])
    return tokens


class RayEngine(EngineBase):
    """Execute ``plan`` on Ray actors; same contract as :class:`casync.LocalEngine`, bit-identical results.

    ``placement``: ``"spread"`` puts actors on different nodes when the cluster has them, ``"pack"`` packs them.
    ``timeout_s`` bounds every sync: a dead actor or a stall raises a :class:`casync.SyncError` subclass.
    ``transport``: ``"direct"`` (default), ``"tcp"``, ``"gloo"``, ``"nccl"`` or ``"objectstore"`` (see the module
    docstring);
    ``transport_options``: ``{"port": int, "ifname": str}`` for the process group's rendezvous port on the
    first worker's node and the network interface (default: the one holding the Ray node's address).
    ``compute_threads``: ops each actor runs at once on the direct plane; give more where an actor has cores of
    its own (one actor per node or per GPU).  By default one per whole CPU the actor reserves
    (``num_cpus_per_actor``, at least 1), as Ray sizes an actor's ``OMP_NUM_THREADS``; without a reservation, 1.
    :meth:`replan` runs another plan with as many actors on the running actors, without starting any.
    """

    def __init__(self, plan: SyncPlan, address: str | None = None, timeout_s: float = 60.0,
                 placement: str = "spread", num_cpus_per_actor: float | None = None,
                 transport: str = DEFAULT_TRANSPORT, transport_options: dict[str, Any] | None = None,
                 compute_threads: int | None = None):
        if not isinstance(plan, SyncPlan):
            raise TypeError(f"RayEngine needs a SyncPlan, got {type(plan).__name__}")
        plan.require_executable("RayEngine")
        if placement not in ("spread", "pack"):
            raise ValueError(f"placement must be 'spread' or 'pack', got {placement!r}")
        if not positive_number(timeout_s):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        if num_cpus_per_actor is not None and not positive_number(num_cpus_per_actor):
            raise ValueError(f"num_cpus_per_actor must be None or a finite positive number, got {num_cpus_per_actor!r}")
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be None, 'auto', 'host:port' or 'ray://host:port', got {address!r}")
        if compute_threads is None:  # one per whole CPU reserved, as Ray sizes an actor's OMP_NUM_THREADS
            reserved = 0 if num_cpus_per_actor is None or transport == "objectstore" else int(num_cpus_per_actor)
            compute_threads = max(1, reserved)
        check_compute_threads(compute_threads)
        if compute_threads > 1 and transport == "objectstore":
            raise ValueError("compute_threads > 1 needs a direct data plane (transport 'direct', 'tcp', 'gloo' or 'nccl'); "
                             "the object-store transport runs one Ray task at a time per actor")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {list(TRANSPORTS)}, got {transport!r}")
        options = dict(transport_options or {})
        unknown = set(options) - {"port", "ifname"}
        if unknown:
            raise ValueError(f"unknown transport_options {sorted(unknown)}; expected 'port' and/or 'ifname'")
        if options and transport in ("tcp", "objectstore"):
            raise ValueError(f"transport_options {sorted(options)} shape a process group ('direct' between nodes, "
                             f"'gloo', 'nccl'); transport {transport!r} forms none (tcp listens on the Ray node's "
                             "address at ports the OS picks)")
        port = options.get("port")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"transport_options['port'] must be an int in 1..65535, got {port!r}")
        ifname = options.get("ifname")
        if ifname is not None and (not isinstance(ifname, str) or not ifname):
            raise ValueError(f"transport_options['ifname'] must be a network interface's name, got {ifname!r}")
        super().__init__()
        self.transport = transport
        self.transport_options = options
        self.compute_threads = compute_threads
        self.plan = plan
        self.timeout_s = float(timeout_s)
        self.program = compile_program(plan) if transport == "objectstore" else None
        self._layouts = layouts(plan)
        self._send_of = {n: next(iter(plan.graph.predecessors(n))) for n in plan.nodes(op="recv")}
        self.state = EngineState()
        self.group = ActorGroup(address, timeout_s, ping="pid", on_fail=self._discard)
        self._mapped: dict[str, MappedResults] = {}  # worker -> its results in shared memory
        try:
            self._start_actors(placement, num_cpus_per_actor or DEFAULT_CPUS_PER_ACTOR)
        except BaseException:
            self.close()
            raise

    @property
    def actors(self) -> dict[str, Any]:
        """Actor name -> Ray actor handle."""
        return self.group.handles

    @property
    def calls_per_step(self) -> int:
        """Ray calls one sync makes: one per actor on the direct data plane; on the object store, one per task
        of the schedule plus each actor's load and collect."""
        if self.program is None:
            return len(self.actors)
        return len(self.program.tasks) + 2 * len(self.actors)

    @property
    def shared_results(self) -> list[str]:
        """Workers whose results reach the driver through shared memory (on its machine) instead of Ray."""
        return sorted(self._mapped)

    # -- lifecycle -------------------------------------------------------------
    def _start_actors(self, placement: str, cpus: float) -> None:
        names = self.plan.actors
        self.group.place([cpus] * len(names), placement, owner="RayEngine")
        partitions = {b.name: list(b.partitions) for b in self.plan.buckets}
        if self.transport == "objectstore":
            for index, name in enumerate(names):
                self.group.start(name, RemoteSyncActor, index, cpus, name, self.program.tasks_of(name),
                                 self.plan.codecs, self.plan.seed, partitions, self._layouts,
                                 allow_out_of_order_execution=True)
            self._get([a.node_id.remote() for a in self.actors.values()], "starting actors")
            return
        shares = actor_shares(self.plan)
        for index, name in enumerate(names):
            self.group.start(name, RemoteExecutorActor, index, cpus, name, shares[name], self.plan.codecs,
                             self.plan.seed, partitions, self._layouts, self.timeout_s, self.compute_threads)
        self._form_data_plane()

    def _form_data_plane(self) -> None:
        """Connect the actors for ``self.plan`` (``casync.runtime.data_plane``) and map the results they share."""
        self.interfaces = form_group(self.actors, [(self.plan, 0)], self.transport, self.transport_options, self._get)
        self._share_results()

    def replan(self, plan: SyncPlan) -> None:
        """Run ``plan`` from now on, on the actors already running: no actor is started.

        The engine's processes are generic: actor i of ``plan`` (``plan.actors``, workers then servers) takes the
        i-th running process, whatever role it had, so any plan with as many actors as the engine has processes
        fits — a ring of 5 workers after a parameter server of 3 workers and 2 servers.  Each process drops
        everything of the old plan (executor, error-feedback residuals, results segment, data plane), takes its
        new share, codecs, seed and partitions, and the data plane is formed afresh (new shared memory and
        sockets; a new process group where the transport has one).  The engine starts over at step 0 with no
        residuals and an empty timeline: the same state as ``RayEngine(plan)`` with this engine's settings
        (transport, placement, CPUs per actor, compute threads, timeout), and results bit for bit that engine's.

        Refused before anything changes (the engine keeps running its old plan): a plan whose actor count differs
        (``ValueError``: processes are never started or left idle here, so placement and reserved CPUs stay those
        of a fresh engine), and any plan on ``transport="objectstore"`` (``ValueError``: its actors are built for
        one plan's tasks).  A closed or failed engine raises :class:`casync.SyncError`, as ``run_flat`` does; an
        actor found dead now raises :class:`casync.WorkerLostError`, and a failure while the new data plane forms
        leaves the engine unusable like any fault.  A plan that needs other settings needs a new engine.
        """
        self.group.check_usable("RayEngine", "build a new one and load_state_dict() the last saved state")
        self._check_replan(plan)
        handles = list(self.actors.values())  # in bundle order: index i runs in bundle i
        self._get([h.pid.remote() for h in handles], "checking the actors before re-planning")
        for mapped in self._mapped.values():  # the actors close their segments below
            mapped.close()
        self._mapped = {}
        self.group.handles = dict(zip(plan.actors, handles))
        shares = actor_shares(plan)
        partitions = {b.name: list(b.partitions) for b in plan.buckets}
        plan_layouts = layouts(plan)
        self._get([self.actors[name].replan.remote(name, shares[name], plan.codecs, plan.seed, partitions,
                                                   plan_layouts) for name in plan.actors], "re-planning the actors")
        self.plan, self._layouts = plan, plan_layouts
        self._send_of = {n: next(iter(plan.graph.predecessors(n))) for n in plan.nodes(op="recv")}
        self.state = EngineState()
        self.clear_timeline()
        self._form_data_plane()

    def _check_replan(self, plan: SyncPlan) -> None:
        """Why the running actors cannot host ``plan``, as an error (nothing is changed by this check)."""
        if not isinstance(plan, SyncPlan):
            raise TypeError(f"replan needs a SyncPlan, got {type(plan).__name__}")
        plan.require_executable("RayEngine")
        if self.transport == "objectstore":
            raise ValueError("replan needs a direct data plane (transport 'direct', 'tcp', 'gloo' or 'nccl'); the "
                             "object-store transport's actors are built for one plan's tasks: build a new RayEngine")
        if len(plan.actors) != len(self.actors):
            raise ValueError(f"replan needs a plan with as many actors as this engine runs: the plan has "
                             f"{len(plan.actors)} ({', '.join(plan.actors)}), the engine {len(self.actors)} "
                             f"({', '.join(self.actors)}); build a new RayEngine for it")

    def _share_results(self) -> None:
        """Workers on the driver's machine hand their results over in shared memory (``shared_results``)."""
        if ray.util.client.ray.is_connected():  # a Ray Client driver runs on another machine
            return
        here = ray.get_runtime_context().get_node_id()
        nodes = self.actor_nodes()
        local = [f"worker:{w}" for w in range(self.plan.workers) if nodes[f"worker:{w}"] == here]
        prefix = f"casync{os.getpid()}r{uuid.uuid4().hex[:8]}"
        names = {w: f"{prefix}-{w.replace(':', '')}" for w in local}
        shared = self._get([self.actors[w].share_results.remote(names[w]) for w in local], "sharing results")
        sizes = {b.name: b.numel for b in self.plan.buckets}
        try:
            self._mapped = {w: MappedResults(names[w], sizes) for w, ok in zip(local, shared) if ok}
        finally:
            self._get([self.actors[w].unlink_results.remote() for w in local], "sharing results")

    def close(self) -> None:
        """Kill the actors and release the placement group; stop Ray if this engine started it."""
        for mapped in self._mapped.values():
            mapped.close()
        self._mapped = {}
        self.group.close()

    # -- running -----------------------------------------------------------------
    def actor_nodes(self) -> dict[str, str]:
        """Actor name -> Ray node id it runs on."""
        names = list(self.actors)
        return dict(zip(names, self._get([self.actors[n].node_id.remote() for n in names], "querying nodes")))

    def run_flat(self, flats: list[Any]) -> SyncOutput:
        """Load per-worker flat buffers into the worker actors, run the iteration, return fresh results.

        ``flats[w]`` is worker w's mapping bucket -> flat float32 buffer, or an ObjectRef of one (made by
        another actor, e.g. one that computed the gradients: the driver never fetches it, and the sync actor
        scans it for NaN/Inf itself).
        """
        self.group.check_usable("RayEngine", "build a new one and load_state_dict() the last saved state")
        check_flats(self.plan, flats)
        step = self.state.step
        mode = self.plan.nonfinite
        reports, flagged = [], {}
        for w, flat in enumerate(flats):
            if isinstance(flat, Mapping):
                found, flagged[w] = scan_worker(self._layouts, w, flat)
                reports += found
        if voids_step(mode, reports):  # decided before anything is submitted: the actors never see it
            return self._void(reports)
        remote_grads = len(flagged) < len(flats)
        keep_previous = remote_grads and mode != "propagate"
        deadline = time.monotonic() + self.timeout_s
        workers = [f"worker:{w}" for w in range(self.plan.workers)]
        names = list(self.actors)
        calls = self._submit(step, flats, flagged, keep_previous)
        collected = self._get([calls[n] for n in names], f"sync step {step}", deadline)
        self._timeline.add(step, op_rows(step, {n: c[1] for n, c in zip(names, collected)}, self._send_of))
        found = [r for c in collected for r in c[2]]
        if voids_step(mode, found):  # an actor's own scan found NaN/Inf: undo the step everywhere
            self._get([self.actors[n].rollback.remote() for n in names], "rolling back a non-finite step")
            return self._void(found)
        results = [collected[names.index(w)][0] for w in workers]
        results = [self._mapped[w].buffers if r is None else r for w, r in zip(workers, results)]
        out = fresh_results(self.plan, results)  # copies: Ray's are read-only, shared ones are the next step's
        self.state = EngineState(step=step + 1, residuals={})
        return SyncOutput(out, nonfinite=reports + found)

    def _submit(self, step: int, flats: list[Any], flagged: dict[int, Any], keep_previous: bool) -> dict[str, Any]:
        """One step's calls; each returns the actor's (results, op records, NaN/Inf reports of its own scan)."""
        worker = {f"worker:{w}": w for w in range(self.plan.workers)}
        if self.transport != "objectstore":  # one call per actor
            return {name: handle.run_step.remote(step, flats[worker[name]] if name in worker else None,
                                                 flagged.get(worker.get(name)) if name in worker else set(),
                                                 keep_previous)
                    for name, handle in self.actors.items()}
        loads = {name: handle.load.remote(step, flats[worker[name]] if name in worker else None,
                                          flagged.get(worker[name]) if name in worker else set(), keep_previous)
                 for name, handle in self.actors.items()}
        tokens = submit_iteration(self.program, self.actors, step, {name: [ref] for name, ref in loads.items()})
        return {name: self.actors[name].collect.remote(step, *tokens[name]) for name in self.actors}

    def _void(self, reports: list[Any]) -> SyncOutput:
        out = void_step(self.plan, reports)  # raises under "raise": step not counted
        self.state = EngineState(step=self.state.step + 1, residuals={})
        return out

    def _get(self, refs: list[Any], what: str, deadline: float | None = None) -> list[Any]:
        try:
            return self.group.get(refs, what, deadline)
        except RayTaskError as exc:
            lost = dead_actors(self.actors, "pid")  # a peer's death fails its neighbours' transfers first
            self.group.fail(f"actor(s) {lost} lost while {what}" if lost else f"a task failed while {what}")
            if lost:
                raise WorkerLostError(f"{what}: actor(s) {lost} died; the others' transfers failed: "
                                      f"{type(exc.cause).__name__}") from exc
            raise SyncError(f"{what}: a task failed: {exc}") from exc

    def _discard(self, reason: str) -> None:
        for handle in self.actors.values():
            try:
                handle.discard.remote()
            except Exception:
                pass

    # -- state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Error-feedback residuals gathered from every actor, and the step counter."""
        self.group.check_usable("RayEngine", "build a new one and load_state_dict() the last saved state")
        residuals: dict[str, np.ndarray] = {}
        for part in self._get([a.get_residuals.remote() for a in self.actors.values()], "reading state"):
            residuals.update(part)
        return EngineState(step=self.state.step, residuals=residuals).to_dict(self.plan)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore residuals and step (validated against the plan) into the actors."""
        self.group.check_usable("RayEngine", "build a new one and load_state_dict() the last saved state")
        restored = EngineState.from_dict(self.plan, state)
        by_actor: dict[str, dict[str, np.ndarray]] = {name: {} for name in self.actors}
        owner = {a["ef_key"]: a["actor"] for _, a in self.plan.graph.nodes(data=True) if a["op"] == "encode" and a["ef"]}
        for key, value in restored.residuals.items():
            by_actor[owner[key]][key] = value
        self._get([self.actors[n].set_residuals.remote(r) for n, r in by_actor.items()], "restoring state")
        self.state = EngineState(step=restored.step, residuals={})


__all__ = ["RayEngine", "submit_iteration"]
