"""``RayEngine.replan``: a new plan on the running actors gives a fresh engine's bits, with nothing of the old plan
left (residuals, step, threads, shared memory), and a plan the actors cannot host is refused before anything
changes."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import ray

import casync
from casync.runtime.ray_engine import RayEngine
from tests.helpers import make_grads

SHAPES = {"w": (2000,), "m": (31, 17), "s": (), "b": (7,)}


def _plan(workers, strategy, codec, **extra):
    return casync.build_plan(SHAPES, workers=workers, strategy=strategy, codec=codec, bucket_bytes=2048, **extra)


def _check_syncs(engine, plan, steps=3, local=None, first_seed=0):
    """``steps`` syncs give LocalEngine's bits (``local``: a reference that already ran earlier steps; a fresh one
    by default, which is what a fresh RayEngine gives), and the same residuals after."""
    local = local or casync.LocalEngine(plan)
    for step in range(first_seed, first_seed + steps):
        grads = make_grads(SHAPES, plan.workers, seed=step)
        expected, got = local.sync(grads), engine.sync(grads)
        for w in range(plan.workers):
            for name in SHAPES:
                np.testing.assert_array_equal(got[w][name], expected[w][name], err_msg=f"step {step} {name} worker {w}")
    ours, theirs = engine.state_dict(), local.state_dict()
    assert ours["step"] == theirs["step"]
    assert ours["residuals"].keys() == theirs["residuals"].keys()
    for key, value in theirs["residuals"].items():
        np.testing.assert_array_equal(ours["residuals"][key], value, err_msg=key)
    return local


def _ours():
    """This driver's shared-memory names (they start with its pid): other processes' come and go meanwhile."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"casync{os.getpid()}")}


def _probe(engine):
    """Per process (in bundle order): pid, thread count, and shared-memory segments it has mapped."""
    def look(self):
        import threading

        with open("/proc/self/maps") as f:
            mapped = {line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                      for line in f if "/dev/shm/casync" in line}
        return os.getpid(), threading.active_count(), len(mapped)

    return ray.get([h.__ray_call__.remote(look) for h in engine.actors.values()])


def test_replan_gives_a_fresh_engines_bits_and_keeps_nothing_of_the_old_plan(ray_local):
    """Five processes run a PS with two servers, then a ring of five workers, an all-gather, and the PS again:
    each plan's results and residuals are a fresh engine's (none of the old plan's residuals leaks into the
    new one), no process is started, threads and mapped segments do not pile up, and no name is left in
    /dev/shm (running, or closed)."""
    before = _ours()
    ps = _plan(3, "ps", "onebit", servers=2, partitions=2)
    ring = _plan(5, "ring", "topk:ratio=0.1")
    allgather = _plan(5, "allgather", "qsgd")
    with RayEngine(ps, timeout_s=60) as engine:
        _check_syncs(engine, ps, steps=2)
        first = _probe(engine)
        pids = [pid for pid, _, _ in first]
        assert engine.shared_results == ["worker:0", "worker:1", "worker:2"]

        engine.replan(ring)
        assert engine.plan is ring and engine.step == 0 and engine.timeline() == []
        assert engine.state_dict()["residuals"] == {}
        assert list(engine.actors) == ring.actors
        assert engine.shared_results == ring.actors
        _check_syncs(engine, ring)
        engine.replan(allgather)
        _check_syncs(engine, allgather)
        assert _ours() == before

        engine.replan(ps)  # the first plan again: as fresh as the first time (no residual of its first run)
        assert list(engine.actors) == ps.actors and engine.shared_results == ["worker:0", "worker:1", "worker:2"]
        _check_syncs(engine, ps, steps=2)
        again = _probe(engine)
        assert [pid for pid, _, _ in again] == pids  # the same processes, in the same bundles
        assert again == first  # as many threads and mapped segments as the first time: nothing piles up
        assert _ours() == before
    assert _ours() == before
    with pytest.raises(casync.SyncError, match="closed"):
        engine.replan(ring)


def test_a_refused_plan_leaves_the_engine_running_its_own(ray_local):
    """A plan with another actor count and a non-plan are refused before anything changes: the
    engine goes on with its plan, step and residuals, bit for bit."""
    plan = _plan(3, "ring", "onebit")
    with RayEngine(plan, timeout_s=60) as engine:
        local = _check_syncs(engine, plan, steps=2)
        with pytest.raises(ValueError, match=r"as many actors.*plan has 4 \(worker:0, worker:1, worker:2, "
                                             r"worker:3\), the engine 3"):
            engine.replan(_plan(4, "ring", "onebit"))
        with pytest.raises(ValueError, match=r"plan has 5 .*server:1"):
            engine.replan(_plan(3, "ps", "onebit", servers=2, partitions=2))
        with pytest.raises(TypeError, match="SyncPlan"):
            engine.replan("ring")
        assert engine.plan is plan and engine.step == 2
        _check_syncs(engine, plan, steps=2, local=local, first_seed=2)


def test_the_object_store_transport_refuses_replan(ray_local):
    plan = _plan(2, "ring", "onebit")
    with RayEngine(plan, timeout_s=60, transport="objectstore") as engine:
        with pytest.raises(ValueError, match="object-store"):
            engine.replan(_plan(2, "allgather", "none"))
        _check_syncs(engine, plan, steps=1)


def test_replan_over_tcp_and_gloo(ray_local):
    """Both other data planes re-form: tcp's sockets and shared memory, gloo's process group (destroyed and
    formed again in the same processes)."""
    for transport, first, second in (
            ("tcp", _plan(3, "ring", "onebit"), _plan(3, "ps", "terngrad")),
            ("gloo", _plan(3, "ring", "onebit"), _plan(2, "ps", "topk:ratio=0.1", servers=1))):
        with RayEngine(first, timeout_s=60, transport=transport) as engine:
            _check_syncs(engine, first, steps=2)
            engine.replan(second)
            assert engine.interfaces == {a: ("lo" if transport == "gloo" else "") for a in second.actors}
            _check_syncs(engine, second)
            engine.replan(first)
            _check_syncs(engine, first, steps=2)


def test_replan_after_a_dead_actor_is_a_typed_error(ray_local):
    """An actor dead before the replan is found and named (WorkerLostError); the engine is then unusable, as after
    any fault: replan and sync both refuse with a SyncError that says so."""
    plan = _plan(2, "ring", "onebit")
    with RayEngine(plan, timeout_s=20) as engine:
        engine.sync(make_grads(SHAPES, 2))
        ray.kill(engine.actors["worker:1"], no_restart=True)
        t0 = time.monotonic()
        with pytest.raises(casync.WorkerLostError, match="worker:1"):
            engine.replan(_plan(2, "allgather", "none"))
        assert time.monotonic() - t0 < 20
        with pytest.raises(casync.SyncError, match="unusable"):
            engine.replan(plan)
        with pytest.raises(casync.SyncError, match="unusable"):
            engine.sync(make_grads(SHAPES, 2))
