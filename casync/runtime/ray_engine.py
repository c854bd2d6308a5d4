"""``RayEngine``: run a plan on Ray actors — one per worker and per dedicated server.

Consecutive ops of an actor are fused into one task (see ``program``); cross-actor edges become
ObjectRefs handed to the receiving task, so Ray moves payloads (shared memory on a node, the object
manager across nodes) and the driver never fetches intermediate data.  A whole iteration is submitted at
once in the program's order; actors run tasks as their inputs arrive (out-of-order execution), so encode of
one bucket overlaps transfer and decode of another.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..engines.inputs import check_flats, flatten_worker_grads, unflatten_results
from ..engines.nonfinite import SyncOutput, layouts, scan_worker
from ..engines.state import EngineState
from ..errors import NonFiniteGradientError, SyncError, SyncTimeoutError, WorkerLostError
from ..plan.syncplan import SyncPlan
from ..schedule import Program, compile_program
from .ray_actor import RemoteSyncActor

DEFAULT_CPUS_PER_ACTOR = 0.1
TIMELINE_STEPS_KEPT = 16  # timeline() covers the most recent iterations only
TIMELINE_FIELDS = ("op", "actor", "tensor", "part", "start", "end", "nbytes", "node", "step", "cpu")


@contextmanager
def _loopback_only() -> Iterator[None]:
    """Keep an embedded Ray on 127.0.0.1.

    On Linux, Ray 2.60 rewrites ``_node_ip_address="127.0.0.1"`` to the routable address and listens on
    every interface unless its multi-node mode is off (the mode it uses by default on macOS/Windows).
    Flipping that flag is the only switch Ray offers after import; restored afterwards.
    """
    try:
        from ray._private import ray_constants
    except ImportError:  # a future Ray without the flag: nothing to flip
        yield
        return
    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if saved is None:
        yield
        return
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def connect_ray(address: str | None, num_cpus: int | None = None, object_store_memory: int | None = None) -> bool:
    """Make sure Ray is up; returns True when this call started it (so the caller should stop it).

    ``address=None``: reuse a Ray already initialised in this process, else start an embedded local Ray
    bound to 127.0.0.1.  ``"auto"``, ``"ray://host:port"`` or ``RAY_ADDRESS``: join that cluster.
    """
    if ray.is_initialized():
        _check_same_cluster(address)
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        with _loopback_only():
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                     object_store_memory=object_store_memory, log_to_driver=False, configure_logging=False)
        return True
    _check_reachable(address)
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    return True if address.startswith("ray://") else False


def _check_same_cluster(address: str | None) -> None:
    """An explicit ``host:port`` must be the cluster this process already joined (else it would silently run
    on the wrong one); ``None``, ``"auto"`` and ``ray://`` addresses reuse what is there."""
    if not address or address == "auto" or "://" in address:
        return
    port = address.rpartition(":")[2]
    current = ray.get_runtime_context().gcs_address
    if port != current.rpartition(":")[2]:
        raise ValueError(f"this process is already connected to the Ray cluster at {current}; it cannot also join "
                         f"{address!r} (call ray.shutdown() first)")


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail fast (ConnectionError) when nothing listens at an explicit ``host:port`` or ``ray://host:port``:
    ``ray.init`` would otherwise retry for minutes.  ``"auto"`` and other forms are left to Ray."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"no Ray cluster reachable at {address!r} ({exc}); start one with `ray start "
                              "--head` or check the address") from None


def _positive_number(value: Any) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and bool(np.isfinite(value)) and value > 0)


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


def release(actors: Any, pg: Any, owns_ray: bool) -> None:
    """Kill ``actors``, remove placement group ``pg`` (None: none) and stop Ray if the caller started it;
    what is already gone is skipped (engines call this from ``close()``)."""
    for handle in actors:
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # already dead
            pass
    if pg is not None:
        try:
            remove_placement_group(pg)
        except Exception:
            pass
    if owns_ray and ray.is_initialized():
        ray.shutdown()


def dead_actors(actors: Mapping[str, Any], ping: str) -> list[str]:
    """Names of ``actors`` whose ``ping`` method fails, pinged all at once (a busy survivor costs at most
    2 s, not 2 s each)."""
    pings = {name: getattr(handle, ping).remote() for name, handle in actors.items()}
    ready, _ = ray.wait(list(pings.values()), num_returns=len(pings), timeout=2.0)
    dead = []
    for name, ref in pings.items():
        if ref in ready:
            try:
                ray.get(ref, timeout=0)
            except Exception:
                dead.append(name)
    return dead


def get_or_fail(refs: list[Any], what: str, timeout_s: float, deadline: float | None, fail: Any,
                actors: Mapping[str, Any], ping: str) -> list[Any]:
    """``ray.get`` within ``timeout_s`` (or until ``deadline``, a ``time.monotonic()``): a timeout or a lost
    actor calls ``fail(reason)`` and raises :class:`SyncTimeoutError` / :class:`WorkerLostError` naming the
    dead actors; a failed task's ``RayTaskError`` is the caller's to map."""
    timeout = timeout_s if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        return ray.get(refs, timeout=timeout)
    except GetTimeoutError:
        fail(f"timed out after {timeout_s:.0f}s while {what}")
        raise SyncTimeoutError(f"{what}: no result within timeout_s={timeout_s:.0f}s") from None
    except RayActorError as exc:
        lost = dead_actors(actors, ping)
        fail(f"actor(s) {lost or '?'} lost while {what}")
        raise WorkerLostError(f"{what}: actor(s) {lost or '(unknown)'} died: {exc.__class__.__name__}") from exc


def timeline_rows(plan: SyncPlan, step: int, records: dict[str, list[tuple]]) -> list[dict[str, Any]]:
    """Actor op records ``(op, tensor, part, start, end, nbytes, node[, cpu])`` as timeline rows sorted by start
    (``cpu`` None where the record has none, e.g. the Trainer's forward/backward/update rows);
    a recv spans from the moment its payload was sent to the moment its task used it."""
    send_end: dict[str, float] = {}
    rows = []
    for actor, actor_records in records.items():
        for op, tensor, part, start, end, nbytes, node, *cpu in actor_records:  # cpu: absent where not measured
            rows.append(dict(op=op, actor=actor, tensor=tensor, part=part, start=start, end=end,
                             nbytes=nbytes, node=node, step=step, cpu=cpu[0] if cpu else None))
            if op == "send":
                send_end[node] = end
    graph = plan.graph
    for row in rows:
        if row["op"] == "recv":
            (send,) = graph.predecessors(row["node"])
            row["start"] = min(send_end.get(send, row["start"]), row["start"])
    return sorted(rows, key=lambda r: r["start"])


class RayEngine:
    """Execute ``plan`` on Ray actors; same contract as :class:`casync.LocalEngine`, bit-identical results.

    ``placement``: ``"spread"`` puts actors on different nodes when the cluster has them, ``"pack"`` packs them.
    ``timeout_s`` bounds every sync: a dead actor or a stall raises a :class:`casync.SyncError` subclass.
    """

    def __init__(self, plan: SyncPlan, address: str | None = None, timeout_s: float = 60.0,
                 placement: str = "spread", num_cpus_per_actor: float | None = None):
        if not isinstance(plan, SyncPlan):
            raise TypeError(f"RayEngine needs a SyncPlan, got {type(plan).__name__}")
        plan.require_executable("RayEngine")
        if placement not in ("spread", "pack"):
            raise ValueError(f"placement must be 'spread' or 'pack', got {placement!r}")
        if not _positive_number(timeout_s):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        if num_cpus_per_actor is not None and not _positive_number(num_cpus_per_actor):
            raise ValueError(f"num_cpus_per_actor must be None or a finite positive number, got {num_cpus_per_actor!r}")
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be None, 'auto', 'host:port' or 'ray://host:port', got {address!r}")
        self.plan = plan
        self.timeout_s = float(timeout_s)
        self.program = compile_program(plan)
        self._layouts = layouts(plan)
        self.state = EngineState.empty(plan)
        self._records: list[dict[str, Any]] = []
        self._broken: str | None = None
        self._closed = False
        self._owns_ray = connect_ray(address)
        self._pg = None
        self.actors: dict[str, Any] = {}
        try:
            self._start_actors(placement, num_cpus_per_actor)
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------
    def _start_actors(self, placement: str, cpus: float | None) -> None:
        names = self.plan.actors
        if cpus is None:  # a nominal share: placement (spread/pack) matters, not CPU accounting
            cpus = DEFAULT_CPUS_PER_ACTOR
        self._pg = placement_group([{"CPU": cpus}] * len(names), strategy="SPREAD" if placement == "spread" else "PACK")
        try:
            ray.get(self._pg.ready(), timeout=self.timeout_s)
        except GetTimeoutError:
            raise SyncTimeoutError(f"placement group of {len(names)} actors x {cpus} CPU not ready in "
                                   f"{self.timeout_s:.0f}s; cluster resources: {ray.cluster_resources()}") from None
        partitions = {b.name: list(b.partitions) for b in self.plan.buckets}
        for index, name in enumerate(names):
            strategy = PlacementGroupSchedulingStrategy(placement_group=self._pg, placement_group_bundle_index=index)
            self.actors[name] = RemoteSyncActor.options(
                num_cpus=cpus, scheduling_strategy=strategy, allow_out_of_order_execution=True, max_restarts=0,
                max_task_retries=0,
            ).remote(name, self.program.tasks_of(name), self.plan.codecs, self.plan.seed, partitions, self._layouts)
        self._get([a.node_id.remote() for a in self.actors.values()], "starting actors")

    def close(self) -> None:
        """Kill the actors and release the placement group; stop Ray if this engine started it."""
        if self._closed:
            return
        self._closed = True
        release(self.actors.values(), self._pg, self._owns_ray)
        self.actors = {}

    def __enter__(self) -> "RayEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        """Best effort for a forgotten engine that joined a running Ray: free its actors.  An engine that
        started Ray does not stop it from a finalizer (unsafe at interpreter exit; Ray goes with the
        process anyway).  ``close()`` or ``with`` is the contract."""
        try:
            if not self._closed and ray.is_initialized() and not self._owns_ray:
                self.close()
        except Exception:
            pass

    # -- running -----------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.state.step

    def actor_nodes(self) -> dict[str, str]:
        """Actor name -> Ray node id it runs on."""
        names = list(self.actors)
        return dict(zip(names, self._get([self.actors[n].node_id.remote() for n in names], "querying nodes")))

    def sync(self, grads: Any) -> SyncOutput:
        """Synchronize one iteration; same input and output contract as ``LocalEngine.sync``."""
        flats, torch_flags = flatten_worker_grads(self.plan, grads)
        results = self.run_flat(flats)
        return SyncOutput(unflatten_results(self.plan, results, torch_flags), results.skipped, results.nonfinite)

    def run_flat(self, flats: list[Any]) -> SyncOutput:
        """Load per-worker flat buffers into the worker actors, run the iteration, return fresh results.

        ``flats[w]`` is worker w's mapping bucket -> flat float32 buffer, or an ObjectRef of one (made by
        another actor, e.g. one that computed the gradients: the driver never fetches it, and the sync actor
        scans it for NaN/Inf itself).
        """
        self._check_usable()
        check_flats(self.plan, flats)
        step = self.state.step
        mode = self.plan.nonfinite
        reports, flagged = [], {}
        for w, flat in enumerate(flats):
            if isinstance(flat, Mapping):
                found, flagged[w] = scan_worker(self._layouts, w, flat)
                reports += found
        if reports and mode != "propagate":  # decided before anything is submitted: the actors never see it
            return self._void_step(reports)
        remote_grads = len(flagged) < len(flats)
        keep_previous = remote_grads and mode != "propagate"
        deadline = time.monotonic() + self.timeout_s
        workers = [f"worker:{w}" for w in range(self.plan.workers)]
        loads = {name: self.actors[name].load.remote(step, flats[w], flagged.get(w), keep_previous)
                 for w, name in enumerate(workers)}
        for name in self.actors:
            if name not in loads:
                loads[name] = self.actors[name].load.remote(step, None, set(), keep_previous)
        tokens = submit_iteration(self.program, self.actors, step, {name: [ref] for name, ref in loads.items()})
        names = list(self.actors)
        collected = self._get([self.actors[n].collect.remote(step, *tokens[n]) for n in names],
                              f"sync step {step}", deadline)
        self._record(step, dict(zip(names, collected)))
        found = [r for c in collected for r in c[2]]
        if found and mode != "propagate":  # an actor's own scan found NaN/Inf: undo the step everywhere
            self._get([self.actors[n].rollback.remote() for n in names], "rolling back a non-finite step")
            return self._void_step(found)
        out = []
        total = sum(b.numel for b in self.plan.buckets)
        for w in workers:  # one fresh writable buffer per worker (results from Ray are read-only views)
            results = collected[names.index(w)][0]
            flat, views, offset = np.empty(total, np.float32), {}, 0
            for b in self.plan.buckets:
                views[b.name] = flat[offset:offset + b.numel]
                offset += b.numel
                views[b.name][...] = results[b.name]
            out.append(views)
        self.state = EngineState(step=step + 1, residuals={})
        return SyncOutput(out, nonfinite=reports + found)

    def _void_step(self, reports: list[Any]) -> SyncOutput:
        """NaN/Inf under ``nonfinite="raise"`` (error, step not counted) or ``"skip"`` (zeros, step counted)."""
        if self.plan.nonfinite == "raise":
            raise NonFiniteGradientError(reports)
        self.state = EngineState(step=self.state.step + 1, residuals={})
        zeros = [{b.name: np.zeros(b.numel, np.float32) for b in self.plan.buckets} for _ in range(self.plan.workers)]
        return SyncOutput(zeros, skipped=True, nonfinite=reports)

    def _check_usable(self) -> None:
        if self._closed:
            raise SyncError("this RayEngine is closed")
        if self._broken:
            raise SyncError(f"this RayEngine is unusable after an earlier failure ({self._broken}); build a new "
                            "one and load_state_dict() the last saved state")

    def _get(self, refs: list[Any], what: str, deadline: float | None = None) -> list[Any]:
        try:
            return get_or_fail(refs, what, self.timeout_s, deadline, self._fail, self.actors, "pid")
        except RayTaskError as exc:
            self._fail(f"a task failed while {what}")
            raise SyncError(f"{what}: a task failed: {exc}") from exc

    def _fail(self, reason: str) -> None:
        self._broken = reason
        for handle in self.actors.values():
            try:
                handle.discard.remote()
            except Exception:
                pass

    # -- timeline --------------------------------------------------------------
    def _record(self, step: int, collected: dict[str, tuple]) -> None:
        rows = timeline_rows(self.plan, step, {actor: c[1] for actor, c in collected.items()})
        self._records.extend(rows)
        keep = step - TIMELINE_STEPS_KEPT
        if self._records and self._records[0]["step"] <= keep:  # bounded memory on long runs
            self._records = [r for r in self._records if r["step"] > keep]

    def timeline(self, step: int | None = None) -> list[dict[str, Any]]:
        """Per-op records (op, actor, tensor, part, start, end, nbytes, node, step, cpu), times in seconds since
        the first record of the selection; ``cpu`` is the CPU seconds the actor's thread spent in the op (less
        than ``end - start`` when it waited for a core).  ``op == "load"`` is shipping gradients in."""
        rows = [dict(r) for r in self._records if step is None or r["step"] == step]
        if rows:
            t0 = min(r["start"] for r in rows)
            for r in rows:
                r["start"] -= t0
                r["end"] -= t0
        return rows

    def draw_timeline(self, path: str, step: int | None = None) -> str:
        """Write the measured timeline as a Gantt chart PNG, one lane per actor."""
        from ..drawing import draw_gantt

        rows = self.timeline(step)
        label = "all steps" if step is None else f"step {step}"
        return draw_gantt(rows, path, title=f"RayEngine measured timeline, {label}: {self.plan!r}",
                          actors=self.plan.actors)

    def clear_timeline(self) -> None:
        self._records = []

    # -- state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Error-feedback residuals gathered from every actor, and the step counter."""
        self._check_usable()
        residuals: dict[str, np.ndarray] = {}
        for part in self._get([a.get_residuals.remote() for a in self.actors.values()], "reading state"):
            residuals.update(part)
        return EngineState(step=self.state.step, residuals=residuals).to_dict(self.plan)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore residuals and step (validated against the plan) into the actors."""
        self._check_usable()
        restored = EngineState.from_dict(self.plan, state)
        by_actor: dict[str, dict[str, np.ndarray]] = {name: {} for name in self.actors}
        owner = {a["ef_key"]: a["actor"] for _, a in self.plan.graph.nodes(data=True) if a["op"] == "encode" and a["ef"]}
        for key, value in restored.residuals.items():
            by_actor[owner[key]][key] = value
        self._get([self.actors[n].set_residuals.remote(r) for n, r in by_actor.items()], "restoring state")
        self.state = EngineState(step=restored.step, residuals={})
