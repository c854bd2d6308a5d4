"""Nothing outlives an engine: open/close cycles and many syncs leave no actor, placement group, ObjectRef
or object-store object behind (benchmarks/soak.py runs the long versions: 10,000 syncs, 100 cycles)."""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import casync
from casync.runtime.ray_engine import RayEngine
from tests import faultkit
from tests.helpers import make_grads

SHAPES = {"w": (5000,), "b": (50,)}


def driver_refs() -> int:
    """ObjectRefs this process holds (Ray's reference table of the driver)."""
    import ray

    return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


def store_objects() -> int:
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    return get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address)).store_stats.num_local_objects


def settle(probe, target: int, seconds: float = 10.0) -> int:
    """Ray frees asynchronously: poll until ``probe()`` is back to ``target`` or the time is up."""
    deadline = time.monotonic() + seconds
    value = probe()
    while value > target and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
        value = probe()
    return value


def test_open_close_cycles_leave_nothing(ray_local):
    """5 cycles here (each starts fresh actor processes: seconds on a busy 2-core machine; a leak shows in the
    first); soak.py runs 100."""
    plan = casync.build_plan(SHAPES, workers=1, strategy="ps", servers=1, codec="onebit")
    grads = make_grads(SHAPES, 1)
    baseline = faultkit.alive_actors(), faultkit.live_placement_groups(), driver_refs(), store_objects()
    for cycle in range(5):
        with RayEngine(plan) as engine:
            assert faultkit.alive_actors() == baseline[0] + 2
            engine.sync(grads)
            engine.state_dict()
        assert settle(faultkit.alive_actors, baseline[0]) == baseline[0], f"cycle {cycle}: actors left alive"
        assert faultkit.live_placement_groups() == baseline[1], f"cycle {cycle}: placement group left"
        # no more than before: an earlier module's leftovers in the shared Ray may be freed meanwhile
        assert settle(driver_refs, baseline[2]) <= baseline[2], f"cycle {cycle}: the driver holds ObjectRefs"
    assert settle(store_objects, baseline[3]) <= baseline[3]


def test_many_syncs_hold_no_refs_and_no_store_objects(ray_local):
    plan = casync.build_plan(SHAPES, workers=3, strategy="ring", codec="topk:ratio=0.1")
    local = casync.LocalEngine(plan)
    with RayEngine(plan) as engine:
        engine.sync(make_grads(SHAPES, 3))
        local.sync(make_grads(SHAPES, 3))
        refs, objects = settle(driver_refs, 0), settle(store_objects, 0)
        for step in range(150):
            grads = make_grads(SHAPES, 3, seed=step)
            out, expected = engine.sync(grads), local.sync(grads)
        np.testing.assert_array_equal(out[2]["w"], expected[2]["w"])
        assert settle(driver_refs, refs) <= refs
        assert settle(store_objects, objects) <= objects
        assert len(engine.timeline()) <= 17 * len(engine.timeline(engine.step - 1))  # bounded history


def test_two_engines_share_the_cluster_or_the_second_fails_at_once_naming_the_first(ray_local, monkeypatch):
    """Default engines reserve a nominal share: two run side by side.  When the first holds the CPUs the
    second needs, the second fails within seconds (not its whole timeout), naming the holder.  (Its first look
    at who holds the CPUs comes after PLACEMENT_PATIENCE_S, 5 s, here 1 s: the 60 s timeout stays the one it
    must not wait out.)"""
    from casync.runtime import ray_layer

    plan = casync.build_plan({"w": (1000,)}, workers=2, strategy="ring", codec="onebit")
    grads = make_grads({"w": (1000,)}, 2)
    with RayEngine(plan) as first, RayEngine(plan) as second:
        assert np.array_equal(first.sync(grads)[0]["w"], second.sync(grads)[0]["w"])
    total = ray_local.cluster_resources()["CPU"]
    with RayEngine(plan, num_cpus_per_actor=total / 2):  # holds every CPU
        monkeypatch.setattr(ray_layer, "PLACEMENT_PATIENCE_S", 1.0)
        start = time.monotonic()
        with pytest.raises(casync.ResourcesUnavailableError, match="other casync engines hold casync-RayEngine"):
            RayEngine(plan, num_cpus_per_actor=1, timeout_s=60)
        assert time.monotonic() - start < 20


def test_an_actor_lost_while_the_data_plane_forms_leaves_no_shared_memory(ray_local):
    """The actors made their receive arenas; one dies before they are all mapped (and unlinked): the engine
    fails with a typed error and no arena name is left in /dev/shm (killed actors unlink nothing)."""
    import os

    from casync.transport.shm import SHM_DIR

    class DyingWhileForming(RayEngine):
        def _get(self, refs, what, deadline=None):
            values = super()._get(refs, what, deadline)
            if what == "connecting the actors" and not getattr(self, "_killed", False):  # the arenas exist now
                self._killed = True
                ray_local.kill(self.actors["worker:2"], no_restart=True)
            return values

    plan = casync.build_plan({"w": (100_000,)}, workers=3, strategy="ring", codec="onebit")
    before = set(os.listdir(SHM_DIR))
    with pytest.raises(casync.SyncError):
        DyingWhileForming(plan, timeout_s=20)
    mine = f"casync{os.getpid()}"  # this driver's names: other processes' segments come and go meanwhile
    assert sorted(n for n in set(os.listdir(SHM_DIR)) - before if n.startswith(mine)) == []
