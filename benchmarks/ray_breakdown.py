"""Where RayEngine's sync span goes: every actor's time in the span, split into categories that add up.

The engine's timeline (``RayEngine.timeline``) says when each op ran and how much CPU it used; Ray's own
task events (the GCS keeps them by default: state changes with timestamps, and per-task profile events
``task:deserialize_arguments`` / ``task:execute`` / ``task:store_outputs``) say when the driver submitted
each Ray call, when the owner pushed it to the actor, and what the actor did around the call's Python
body.  Put together, each actor's lane from the first op of a sync to its last (the *sync span*) is cut
into disjoint pieces:

inside a Ray task of the actor
    ``op_cpu``       the ops' own CPU time (thread CPU of encode/decode/merge/send; a recv only hands over);
    ``op_wait``      op wall time the op's thread was runnable but waited for a core (Linux schedstat, the
                     rows' ``queued``; without that reading all wall time beyond the CPU counts here);
    ``op_blocked``   the rest of the op's wall time beyond its CPU: the thread was blocked, in ops that take
                     no lock waiting for the GIL (the actor's other threads held it);
    ``deserialize``  resolving the call's arguments: object-store fetch of the payloads + unpickling;
    ``store``        storing the call's returns: serializing payloads and copying them into the object store;
    ``between_ops``  the call's body outside the ops: ``run()``'s own Python (with a direct data plane, the
                     waits on the transport land here too);
    ``task_loop``    the rest of the call: Ray's task loop around deserialization, body and store;
between two Ray tasks of the actor (the actor idle), by what the next task was waiting for
    ``wait_inputs``  its inputs were still being produced upstream (a producing task not finished);
    ``submission``   inputs there, but the driver had not submitted the task yet;
    ``owner``        inputs there and task submitted, but the owner (the driver) had not pushed it to the actor
                     yet: the producers' completion replies and the owner's dependency resolution;
    ``delivery``     pushed, not started: the push RPC, fetching argument locations, the actor's queue;
    ``tail``         after the actor's last task of the sync, until the last op of any actor.

Per actor the categories sum to the span exactly (:func:`actor_breakdown`); the report averages them over
actors, so the averages sum to the span too.  The timeline is placed on Ray's clock by the actors' ``load``
calls (:func:`absolute_rows`); an op row outside every call's body (a missing task event) counts as idle,
and :func:`sync_breakdown` reports how many rows matched.

Ray's task events are read through ``ray._private.state`` (the only way without the dashboard running);
:func:`ray_tasks` is the one place that touches it.
"""
from __future__ import annotations

import bisect
import os
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: category -> what it means (report order)
CATEGORIES: dict[str, str] = {
    "op_cpu": "ops: own CPU",
    "op_wait": "ops: waiting for a core",
    "op_blocked": "ops: blocked (the GIL)",
    "deserialize": "args: object-store fetch + unpickle",
    "store": "returns: serialize + copy into the object store",
    "between_ops": "in task body, between ops",
    "task_loop": "in task, Ray's task loop",
    "wait_inputs": "idle: inputs still upstream",
    "submission": "idle: not yet submitted by the driver",
    "owner": "idle: owner round trip (completion reply, dependency resolution, push)",
    "delivery": "idle: push RPC, args fetch, actor queue",
    "tail": "idle: after the actor's last task",
}

#: how far an op may seem to stick out of its call's body: the two clocks are aligned to within this
SLACK_S = 1e-4


@dataclass
class RayTask:
    """One Ray actor call as its task events recorded it (seconds since the epoch; None: not recorded)."""

    actor_id: str
    method: str                    # "run", "load", "collect", ...
    created: float | None          # PENDING_ARGS_AVAIL: the driver submitted it
    submitted: float | None        # SUBMITTED_TO_WORKER: the owner resolved its dependencies and pushed it
    start: float                   # the actor began the call (profile event task::...)
    end: float                     # ... and finished it, returns stored
    deserialize: tuple[float, float] | None = None
    execute: tuple[float, float] | None = None
    store: tuple[float, float] | None = None
    deps: list[RayTask] = field(default_factory=list, repr=False)  # tasks whose results it consumes

    @property
    def inputs_ready(self) -> float | None:
        """When the last task it depends on had finished (returns stored); None: no known dependency."""
        return max((d.end for d in self.deps), default=None)


# -----------------------------------------------------------------------------------------------------
# Ray's task events
# -----------------------------------------------------------------------------------------------------

def ray_tasks(actor_ids: Iterable[str], since: float, until: float) -> tuple[list[RayTask], list[tuple[float, float]]]:
    """The calls of ``actor_ids`` (hex) the driver created in ``[since, until]``, and the driver's
    ``submit_task`` profile intervals in that window.

    Events reach the GCS about once a second: call this a second or more after the last task ran.
    """
    from ray._private.state import state
    from ray.core.generated import common_pb2

    status = {v.name: v.number for v in common_pb2.TaskStatus.DESCRIPTOR.values}
    wanted = set(actor_ids)
    tasks, submits = [], []
    for event in state._get_all_task_events():
        profile = {p.event_name: (p.start_time / 1e9, p.end_time / 1e9) for p in event.profile_events.events}
        if event.profile_events.component_type == "driver":
            submits += [(p.start_time / 1e9, p.end_time / 1e9) for p in event.profile_events.events
                        if p.event_name == "submit_task" and since <= p.start_time / 1e9 <= until]
        actor = event.task_info.actor_id.hex()
        if actor not in wanted or not event.task_info.name:
            continue
        ts = {k: v / 1e9 for k, v in event.state_updates.state_ts_ns.items()}
        created = ts.get(status["PENDING_ARGS_AVAIL"])
        whole = next((v for k, v in profile.items() if k.startswith("task::")), None)
        if created is None or whole is None or not since <= created <= until:
            continue
        tasks.append(RayTask(actor, event.task_info.name.rsplit(".", 1)[-1], created,
                             ts.get(status["SUBMITTED_TO_WORKER"]), whole[0], whole[1],
                             profile.get("task:deserialize_arguments"), profile.get("task:execute"),
                             profile.get("task:store_outputs")))
    return sorted(tasks, key=lambda t: t.created), sorted(submits)


# -----------------------------------------------------------------------------------------------------
# one sync: ops matched to Ray tasks, then each actor's span cut into categories
# -----------------------------------------------------------------------------------------------------

def absolute_rows(rows: Sequence[dict[str, Any]], tasks: Sequence[RayTask], actor_ids: Mapping[str, str]) -> list[dict]:
    """``RayEngine.timeline(step)`` rows (times relative to the step's first row) moved onto the epoch clock of
    Ray's events.

    Each actor's ``load`` row lies inside its ``load`` call's body, so ``body start - row start`` is a lower
    bound of the shift, short by however long the actor took from Ray starting the body to the row's first
    clock reading (a preempted actor: milliseconds).  The largest lower bound over actors is the tightest; the
    smallest ``body end - row end`` is an upper bound, checked.
    """
    lower, upper = [], []
    for row in rows:
        if row["op"] != "load":
            continue
        call = next((t for t in tasks if t.method == "load" and t.actor_id == actor_ids.get(row["actor"])
                     and t.execute), None)
        if call is not None:
            lower.append(call.execute[0] - row["start"])
            upper.append(call.execute[1] - row["end"])
    if not lower:
        raise ValueError("no load row matches a Ray 'load' call: cannot place the timeline on Ray's clock")
    offset = max(lower)
    if offset > min(upper) + SLACK_S:
        raise ValueError(f"the timeline's load rows do not fit in Ray's load calls (shift between "
                         f"{max(lower):.6f} and {min(upper):.6f})")
    return [dict(r, start=r["start"] + offset, end=r["end"] + offset) for r in rows]


def match_ops(rows: Sequence[dict], tasks: Sequence[RayTask], actor_ids: Mapping[str, str]) -> dict[str, RayTask]:
    """Plan node -> the Ray call that executed it (the call on the op's actor whose body contains the op).

    A ``recv`` row starts at its payload's send; its own execution is at its end.
    """
    by_actor: dict[str, list[RayTask]] = {}
    for t in tasks:
        if t.execute:
            by_actor.setdefault(t.actor_id, []).append(t)
    found = {}
    for row in rows:
        if row["op"] == "load" or not row.get("node"):
            continue
        at = row["end"] if row["op"] == "recv" else (row["start"] + row["end"]) / 2
        for t in by_actor.get(actor_ids.get(row["actor"], ""), []):
            if t.execute[0] - SLACK_S <= at <= t.execute[1] + SLACK_S:
                found[row["node"]] = t
                break
    return found


def link_dependencies(program: Any, node_task: Mapping[str, RayTask], tasks: Sequence[RayTask],
                      actor_ids: Mapping[str, str]) -> None:
    """Fill each matched call's ``deps`` from the engine's schedule (``casync.schedule.Program``): the calls
    of its same-actor predecessors, of the tasks producing its remote inputs, and its actor's ``load``."""
    call_of = {}
    for task in program.tasks:
        calls = {id(node_task[n]): node_task[n] for n in task.nodes if n in node_task}
        if len(calls) == 1:
            call_of[task.id] = next(iter(calls.values()))
    loads = {t.actor_id: t for t in tasks if t.method == "load"}
    for task in program.tasks:
        call = call_of.get(task.id)
        if call is None:
            continue
        deps = [call_of.get(i) for i in task.after] + [call_of.get(program.producer[u][0]) for u in task.remote_inputs]
        deps.append(loads.get(actor_ids.get(task.actor, "")))
        call.deps = [d for d in deps if d is not None and d is not call]


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _add_op(out: dict[str, float], row: dict, wall: float) -> None:
    """Add ``wall`` seconds of op ``row`` (all of it, or the part inside a call's body and the span) to
    ``out`` as own CPU, waiting for a core and blocked; CPU and run-queue wait are prorated to that part."""
    share = wall / max(row["end"] - row["start"], 1e-12)
    cpu = min(wall, (row.get("cpu") or 0.0) * share)
    queued = row.get("queued")
    queued = wall - cpu if queued is None else min(wall - cpu, queued * share)
    out["op_cpu"] += cpu
    out["op_wait"] += queued
    out["op_blocked"] += wall - cpu - queued


def actor_breakdown(rows: Sequence[dict], calls: Sequence[RayTask], span: tuple[float, float]) -> dict[str, float]:
    """Seconds of one actor's lane in ``span`` per category; they sum to the span's length.

    ``rows``: this actor's op rows (epoch clock); ``calls``: this actor's Ray calls (with ``deps`` filled for
    the gap attribution), any order.
    """
    lo, hi = span
    out = dict.fromkeys(CATEGORIES, 0.0)
    calls = sorted((c for c in calls if c.end > lo and c.start < hi), key=lambda c: c.start)
    # inside calls: ops (clipped to their call's body), argument and return handling, the rest
    for c in calls:
        body = c.execute or (c.start, c.end)
        ops_wall = 0.0
        for r in rows:
            if r["op"] == "load":
                continue
            s, e = (r["end"], r["end"]) if r["op"] == "recv" else (r["start"], r["end"])
            if not body[0] - SLACK_S <= (s + e) / 2 <= body[1] + SLACK_S:
                continue  # another call's op
            s, e = max(s, body[0], lo), min(e, body[1], hi)
            if e <= s:
                continue
            wall = e - s
            _add_op(out, r, wall)
            ops_wall += wall
        deser = _overlap(*c.deserialize, lo, hi) if c.deserialize else 0.0
        store = _overlap(*c.store, lo, hi) if c.store else 0.0
        out["deserialize"] += deser
        out["store"] += store
        body_s = _overlap(*body, lo, hi) if c.execute else ops_wall
        out["between_ops"] += max(0.0, body_s - ops_wall)
        out["task_loop"] += max(0.0, _overlap(c.start, c.end, lo, hi) - deser - store - body_s)
    # between calls: what the next call was waiting for, in the order it happens
    edge = lo
    for c in calls:
        if c.start > edge:
            _attribute_gap(out, edge, min(c.start, hi), c)
        edge = max(edge, c.end)
    if edge < hi:
        if calls:
            out["tail"] += hi - edge
        else:
            out["wait_inputs"] += hi - edge
    return out


def _attribute_gap(out: dict[str, float], g0: float, g1: float, call: RayTask) -> None:
    """Split the idle stretch ``[g0, g1]`` before ``call`` at: inputs ready, created, pushed to the actor."""
    def at(t: float | None, floor: float) -> float:
        return floor if t is None else min(max(t, floor), g1)

    ready = at(call.inputs_ready, g0)
    created = at(call.created, ready)
    pushed = at(call.submitted, created)
    out["wait_inputs"] += ready - g0
    out["submission"] += created - ready
    out["owner"] += pushed - created
    out["delivery"] += g1 - pushed


def sync_breakdown(rows: Sequence[dict[str, Any]], tasks: Sequence[RayTask], actor_ids: Mapping[str, str],
                   program: Any | None = None) -> dict[str, Any]:
    """One sync: rows of ``engine.timeline(step)``, the Ray calls of that step, actor name -> actor id (hex),
    the engine's schedule (``engine.program``; None: no gap attribution by dependency).

    Returns the span, per actor seconds per category, their mean over actors, and how many op rows were
    matched to a Ray call (``matched``/``ops``).
    """
    rows = absolute_rows(rows, tasks, actor_ids)
    ops = [r for r in rows if r["op"] != "load"]
    span = (min(r["start"] for r in ops), max(r["end"] for r in ops))
    node_task = match_ops(ops, tasks, actor_ids)
    if program is not None:
        link_dependencies(program, node_task, tasks, actor_ids)
    per_actor = {}
    for name, aid in actor_ids.items():
        per_actor[name] = actor_breakdown([r for r in ops if r["actor"] == name],
                                          [t for t in tasks if t.actor_id == aid], span)
    mean = {k: statistics.fmean(p[k] for p in per_actor.values()) for k in CATEGORIES}
    return {"span_s": span[1] - span[0], "span": span, "per_actor": per_actor, "mean": mean,
            "ops": len(ops), "matched": len(node_task),
            "calls": sum(1 for t in tasks if t.method == "run")}


def executor_breakdown(rows: Sequence[dict[str, Any]], calls: int) -> dict[str, Any]:
    """One sync on the direct data plane (per-rank executors, one Ray call per actor): each actor's span cut
    into its ops' own CPU, their waiting for a core and blocked, the executor's own time between ops whose inputs were
    there (``between_ops``), and idle time waiting for a payload or a local input (``wait_inputs``); the
    other categories are the object store's and stay 0.  Same return shape as :func:`sync_breakdown`."""
    ops = [r for r in rows if r["op"] != "load"]
    span = (min(r["start"] for r in ops), max(r["end"] for r in ops))
    per_actor = {}
    for name in sorted({r["actor"] for r in ops}):
        out = dict.fromkeys(CATEGORIES, 0.0)
        mine = sorted((r for r in ops if r["actor"] == name and r["op"] in ("encode", "decode", "merge", "send")),
                      key=lambda r: r["start"])
        arrived = sorted(r["end"] for r in ops if r["actor"] == name and r["op"] == "recv")
        edge = span[0]
        for r in mine:
            _add_op(out, r, r["end"] - r["start"])
            gap = max(0.0, r["start"] - edge)
            # idle until the last payload this op could have been waiting for; the rest is the executor's own
            waited = bisect.bisect_right(arrived, r["start"]) and arrived[bisect.bisect_right(arrived, r["start"]) - 1]
            idle = max(0.0, min(r["start"], waited) - edge) if waited and waited > edge else 0.0
            out["wait_inputs"] += idle
            out["between_ops"] += gap - idle
            edge = max(edge, r["end"])
        out["tail"] += max(0.0, span[1] - edge)
        per_actor[name] = out
    mean = {k: statistics.fmean(p[k] for p in per_actor.values()) for k in CATEGORIES}
    return {"span_s": span[1] - span[0], "span": span, "per_actor": per_actor, "mean": mean, "ops": len(ops),
            "matched": len(ops), "calls": calls}


# -----------------------------------------------------------------------------------------------------
# CPU seconds and page faults per process group (Linux /proc)
# -----------------------------------------------------------------------------------------------------

def _proc_stat(pid: int) -> tuple[float, float, int] | None:
    """(user s, system s, minor page faults) of a process so far; None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def machine_busy_s() -> float:
    """CPU seconds all cores of this machine have been busy so far (every process; not idle, not iowait)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def process_groups(actor_pids: Iterable[int]) -> dict[str, list[int]]:
    """The driver (this process), the engine's actors, and the Ray processes the driver started, by name:
    ``raylet``, ``gcs_server``, ``other Ray`` (idle workers, log monitor, ...)."""
    from casync.runtime.calibrate import _ray_service_pids

    actors = set(actor_pids)
    groups: dict[str, list[int]] = {"driver": [os.getpid()], "actors": sorted(actors), "raylet": [],
                                    "gcs_server": [], "other Ray": []}
    for pid in _ray_service_pids(actors):
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        groups[name if name in ("raylet", "gcs_server") else "other Ray"].append(pid)
    return groups


def _schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for a CPU) of a process's main thread so far."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            run_ns, wait_ns, _ = f.read().split()
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def cpu_sample(groups: Mapping[str, Sequence[int]], last: dict[int, tuple[float, float, int]]) -> dict[str, float]:
    """Cumulative counters now: per group CPU seconds (user+sys, all threads) and minor page faults, the
    actors' main threads (where Ray runs their calls) on a CPU / waiting for one, and the machine's busy
    seconds.  ``last``: pid -> its latest counters, kept for a process that exits (Ray ends idle workers)."""
    out = {}
    for name, pids in groups.items():
        for pid in pids:
            last[pid] = _proc_stat(pid) or last.get(pid, (0.0, 0.0, 0))
        stats = [last[p] for p in pids]
        out[name] = sum(u + s for u, s, _ in stats)
        out[f"{name} faults"] = sum(f for _, _, f in stats)
    sched = [_schedstat(p) for p in groups.get("actors", ())]
    out["actor thread on CPU"] = sum(r for r, _ in sched)
    out["actor thread waiting for CPU"] = sum(w for _, w in sched)
    out["machine"] = machine_busy_s()
    return out


class CpuSampler:
    """Samples :func:`cpu_sample` every ``interval`` seconds on a thread, so CPU can be read for any window
    afterwards (:meth:`between`), e.g. a sync span known only once the sync is over.  Reading ~10 /proc
    files per sample costs a few percent of one core at 10 ms."""

    def __init__(self, groups: Mapping[str, Sequence[int]], interval: float = 0.01):
        import threading

        self.groups, self.interval = groups, interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._last: dict[int, tuple[float, float, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), cpu_sample(self.groups, self._last)))
            self._stop.wait(self.interval)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> dict[str, float]:
        """Counters at time ``t``, interpolated linearly between the samples around it."""
        if len(self.samples) < 2:
            raise ValueError("fewer than two CPU samples: was the sampler running over the window?")
        times = [s[0] for s in self.samples]
        i = min(max(bisect.bisect_left(times, t), 1), len(times) - 1)
        (t0, a), (t1, b) = self.samples[i - 1], self.samples[i]
        w = 0.0 if t1 == t0 else min(max((t - t0) / (t1 - t0), 0.0), 1.0)
        return {k: a[k] + w * (b[k] - a[k]) for k in a}

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """Counter increments over ``[t0, t1]``, plus ``outside`` (machine busy time no group accounts for:
        other users of the machine) and ``idle`` (cores x window not busy)."""
        a, b = self.at(t0), self.at(t1)
        out = {k: b[k] - a[k] for k in a}
        ours = sum(out[g] for g in self.groups)
        out["outside"] = max(0.0, out["machine"] - ours)
        out["idle"] = max(0.0, (os.cpu_count() or 1) * (t1 - t0) - out["machine"])  # /proc/stat: all CPUs
        return out
