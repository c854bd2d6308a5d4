"""The Ray layer every Ray-backed engine shares: connecting, placing actors, mapping failures, releasing.

``connect_ray`` joins or starts Ray (an embedded one bound to 127.0.0.1 by default); :class:`ActorGroup`
places one actor per plan actor in a placement group (``"spread"`` over nodes or ``"pack"``), waits for
results within a timeout and turns Ray's failures into casync's typed errors
(:class:`~casync.errors.SyncTimeoutError`, :class:`~casync.errors.WorkerLostError`, naming the dead
actors), and releases actors, placement group and (if it started it) Ray together.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..errors import ResourcesUnavailableError, SyncError, SyncTimeoutError, WorkerLostError

#: CPUs an actor reserves by default: a nominal share, so placement (spread/pack) matters, not CPU accounting
DEFAULT_CPUS_PER_ACTOR = 0.1
#: Seconds to wait for a placement before checking whether it can succeed at all
PLACEMENT_PATIENCE_S = 5.0


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


@contextmanager
def ray_session(address: str | None, num_cpus: int | None = None) -> Iterator[None]:
    """Ray up for the duration of the block: joined or started as :func:`connect_ray` does, and stopped at
    the end only if this block started it."""
    started = connect_ray(address, num_cpus=num_cpus)
    try:
        yield
    finally:
        if started and ray.is_initialized():
            ray.shutdown()


def _check_same_cluster(address: str | None) -> None:
    """An explicit ``host:port`` must be the cluster this process already joined (else it would silently run
    on the wrong one); ``None``, ``"auto"`` and ``ray://`` addresses reuse what is there."""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    current = ray.get_runtime_context().gcs_address
    current_host, _, current_port = current.rpartition(":")
    if port != current_port or not _same_host(host, current_host):
        raise ValueError(f"this process is already connected to the Ray cluster at {current}; it cannot also join "
                         f"{address!r} (call ray.shutdown() first)")


def _same_host(a: str, b: str) -> bool:
    """Whether host names or addresses ``a`` and ``b`` name one machine: they resolve to a common address, or
    both to addresses of this machine (``localhost`` and the node's own IP are one)."""
    ips_a, ips_b = _addresses(a), _addresses(b)
    return bool(ips_a & ips_b) or (_is_local(ips_a) and _is_local(ips_b))


def _addresses(host: str) -> set[str]:
    import socket

    host = host.strip("[]")
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:  # not resolvable here: compared as written
        return {host}


def _is_local(ips: set[str]) -> bool:
    """Whether one of ``ips`` belongs to this machine (a socket can be bound to it)."""
    import socket

    for ip in ips:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.bind((ip, 0))
            return True
        except OSError:
            continue
    return False


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


def positive_number(value: Any) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and bool(np.isfinite(value)) and value > 0)


#: the Ray session engines started (:func:`_session_key`) and how many open engines use it: the last one to close
#: stops it, so closing the engine that happened to start Ray never pulls it out from under another engine
_SHARED_RAY: dict[str, Any] = {"session": None, "holders": 0}


def _session_key() -> str | None:
    """An id of the Ray session this process is connected to (None when it cannot tell, e.g. a Ray Client)."""
    try:
        node = ray._private.worker.global_worker.node
        return f"{ray.get_runtime_context().gcs_address}/{node.session_name}"
    except Exception:
        return None


def hold_ray(started: bool) -> bool:
    """Count the caller among the users of a Ray that an engine started (``started``: this caller started it);
    returns whether the caller must :func:`release` it (``owns_ray``)."""
    key = _session_key()
    if started:
        _SHARED_RAY.update(session=key, holders=1)
        return True
    if key is not None and key == _SHARED_RAY["session"] and _SHARED_RAY["holders"] > 0:
        _SHARED_RAY["holders"] += 1
        return True
    return False


def _unhold_ray() -> bool:
    """One user of the engines' Ray is done; returns whether it was the last (Ray should stop)."""
    if _SHARED_RAY["session"] != _session_key():  # that session is gone already (someone shut it down): never
        _SHARED_RAY.update(session=None, holders=0)  # stop the one this process may have joined since
        return False
    _SHARED_RAY["holders"] = max(0, _SHARED_RAY["holders"] - 1)
    if _SHARED_RAY["holders"] == 0:
        _SHARED_RAY["session"] = None
        return True
    return False


def release(actors: Any, pg: Any, owns_ray: bool) -> None:
    """Kill ``actors``, remove placement group ``pg`` (None: none) and stop Ray if the caller started it (or
    joined one an engine started, :func:`hold_ray`) and no other open engine uses it; what is already gone is
    skipped (engines call this from ``close()``)."""
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
    if owns_ray and _unhold_ray() and ray.is_initialized():
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
    dead actors; a failed task's ``RayTaskError`` is the caller's to map.  Results are taken as they come,
    so one failed call ends the wait at once even while others are still blocked (say, on a peer that died)."""
    end = time.monotonic() + timeout_s if deadline is None else deadline
    pending = list(refs)
    values: dict[Any, Any] = {}
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, end - time.monotonic()))
            if not ready:
                raise GetTimeoutError(what)
            # raises this call's error now, not after the slowest call; each result is fetched once
            values.update(zip(ready, ray.get(ready)))
        return [values[ref] for ref in refs]
    except GetTimeoutError:
        fail(f"timed out after {timeout_s:.0f}s while {what}")
        raise SyncTimeoutError(f"{what}: no result within timeout_s={timeout_s:.0f}s") from None
    except RayActorError as exc:
        lost = dead_actors(actors, ping)
        fail(f"actor(s) {lost or '?'} lost while {what}")
        raise WorkerLostError(f"{what}: actor(s) {lost or '(unknown)'} died: {exc.__class__.__name__}") from exc


def _placement_blocked(wanted_cpus: float) -> str:
    """Why ``wanted_cpus`` cannot be placed now, when it is clear: too few CPUs in the whole cluster, or other
    casync engines holding them (named); empty when Ray may still find room (nodes joining)."""
    from ray.util.placement_group import placement_group_table

    total = ray.cluster_resources().get("CPU", 0.0)
    if wanted_cpus > total:
        return f"the cluster has {total:g} CPUs in all"
    holders = [f"{v['name']} ({sum(b.get('CPU', 0.0) for b in v['bundles'].values()):g} CPUs)"
               for v in placement_group_table().values()
               if v.get("state") == "CREATED" and str(v.get("name", "")).startswith("casync-")]
    free = ray.available_resources().get("CPU", 0.0)
    if holders and wanted_cpus > free:
        return (f"{free:g} of the cluster's {total:g} CPUs are free; other casync engines hold {', '.join(holders)} "
                "— close() them (or use them in a with block) first, or ask for fewer CPUs per actor")
    return ""


class ActorGroup:
    """The actors of one engine, in one placement group; ``get`` maps failures and marks the group broken.

    ``ping``: a cheap method every actor has (used to tell which actors died).  ``on_fail(reason)`` is
    called once per failure before the typed error is raised (engines use it to drop half-done steps).
    """

    def __init__(self, address: str | None, timeout_s: float, *, ping: str = "pid", num_cpus: int | None = None,
                 on_fail: Callable[[str], None] | None = None):
        self.timeout_s = float(timeout_s)
        self.ping = ping
        self.on_fail = on_fail
        self.handles: dict[str, Any] = {}
        self.broken: str | None = None
        self.closed = False
        self.pg = None
        self.owns_ray = hold_ray(connect_ray(address, num_cpus=num_cpus))

    def place(self, cpus: list[float], placement: str, hint: str = "", owner: str = "engine") -> None:
        """Reserve one bundle per actor (``"spread"`` over nodes or ``"pack"``) within the timeout.

        When the CPUs are held by other casync engines, or the cluster has too few, this fails within
        :data:`PLACEMENT_PATIENCE_S` (not the whole timeout), naming who holds what and how to free it."""
        if placement not in ("spread", "pack"):
            raise ValueError(f"placement must be 'spread' or 'pack', got {placement!r}")
        self.pg = placement_group([{"CPU": c} for c in cpus], strategy="SPREAD" if placement == "spread" else "PACK",
                                  name=f"casync-{owner}-{os.getpid()}-{id(self):x}")
        waited, patience = 0.0, min(self.timeout_s, PLACEMENT_PATIENCE_S)
        while True:
            step = patience if waited < patience else self.timeout_s - waited
            ready, _ = ray.wait([self.pg.ready()], timeout=max(0.0, step))
            if ready:
                return
            waited += step
            why = _placement_blocked(sum(cpus))
            if why or waited >= self.timeout_s:
                raise ResourcesUnavailableError(
                    f"placement group of {len(cpus)} actors ({sum(cpus):g} CPUs) not ready in {waited:.0f}s: "
                    + (why or f"cluster resources: {ray.cluster_resources()}") + (f"; {hint}" if hint else ""))

    def start(self, name: str, remote_cls: Any, bundle: int, cpus: float, *args: Any, **options: Any) -> Any:
        """Start actor ``name`` of ``remote_cls`` in bundle ``bundle``; no restarts, no retries (a lost actor
        is an error the engine reports, never a silent replay)."""
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=bundle)
        self.handles[name] = remote_cls.options(num_cpus=cpus, scheduling_strategy=strategy, max_restarts=0,
                                                max_task_retries=0, **options).remote(*args)
        return self.handles[name]

    def get(self, refs: list[Any], what: str, deadline: float | None = None) -> list[Any]:
        """``ray.get`` within the timeout; a stall or a lost actor marks the group broken and raises."""
        return get_or_fail(refs, what, self.timeout_s, deadline, self.fail, self.handles, self.ping)

    def fail(self, reason: str) -> None:
        self.broken = reason
        if self.on_fail is not None:
            self.on_fail(reason)

    def check_usable(self, what: str, rebuild: str) -> None:
        if self.closed:
            raise SyncError(f"this {what} is closed")
        if self.broken:
            raise SyncError(f"this {what} is unusable after an earlier failure ({self.broken}); {rebuild}")

    def close(self) -> None:
        """Kill the actors, release the placement group, and stop Ray if this group started it."""
        if self.closed:
            return
        self.closed = True
        release(self.handles.values(), self.pg, self.owns_ray)
        self.handles = {}

    def __del__(self) -> None:
        """Best effort for a forgotten engine: free its actors, unless it would be the one to stop Ray (unsafe
        from a finalizer at interpreter exit; Ray goes with the process).  ``close`` stops Ray only for the last
        engine holding a Ray one of them started."""
        try:
            if self.closed or not ray.is_initialized():
                return
            others_hold_it = _SHARED_RAY["holders"] > 1 and _SHARED_RAY["session"] == _session_key()
            if not self.owns_ray or others_hold_it:
                self.close()
        except Exception:
            pass
