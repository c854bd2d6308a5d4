"""RayEngine against the LocalEngine reference: bitwise results, overlap, failures, state."""
from __future__ import annotations

import time

import numpy as np
import pytest
import ray

import casync
from casync.runtime.ray_engine import RayEngine
from tests.engines.conformance import RayEngines
from tests.helpers import make_grads

SHAPES = {"w": (2000,), "m": (31, 17), "s": (), "b": (7,)}
CONFIGS = [
    ("ring", "onebit", 2, {}),
    ("ring", "topk:ratio=0.1", 5, {}),
    ("ring", "none", 3, {}),
    ("allgather", "randomk:ratio=0.2", 3, {}),
    ("allgather", "qsgd", 4, {}),
    ("ps", "terngrad", 3, {}),
    ("ps", "onebit", 4, {"servers": 2}),
    ("ps", "tbq", 5, {"partitions": 7}),
]


@pytest.fixture(scope="class")
def kept(ray_local):
    """Engines kept for the class's tests, one per actor count, re-planned for each test's plan (the first test of
    each count starts its engine): what these tests check is the plan's results, not starting actors."""
    engines = RayEngines()
    yield engines.maker("direct")
    engines.close()  # before the tests that need the shared Ray's CPUs free


class TestOnKeptEngines:
    """Results, timeline and input checks of plans, on engines re-planned from test to test (``RayEngine.replan``
    gives a fresh engine's state and bits, tests/runtime/test_replan.py); the tests below the class start their
    engines, as what they check is the engine's start, its settings or its end."""

    @pytest.mark.parametrize("strategy,codec,workers,extra", CONFIGS,
                             ids=[f"{s}-{c}-{n}w-{'-'.join(f'{k}{v}' for k, v in e.items())}" for s, c, n, e in CONFIGS])
    def test_bitwise_identical_to_local_engine(self, kept, strategy, codec, workers, extra):
        plan = casync.build_plan(SHAPES, workers=workers, strategy=strategy, codec=codec, bucket_bytes=2048, **extra)
        with kept(plan) as engine:
            _check_three_syncs_against_local_engine(plan, engine)

    def test_timeline_shows_overlap_between_tensors(self, kept, tmp_path):
        """Some op of one tensor runs while an op of another tensor runs on another actor."""
        shapes = {f"t{i}": (400_000,) for i in range(4)}
        plan = casync.build_plan(shapes, workers=4, strategy="ring", codec="onebit", bucket_bytes=0)
        grads = make_grads(shapes, 4)
        with kept(plan) as engine:
            engine.sync(grads)
            rows = [r for r in engine.timeline() if r["op"] in ("encode", "decode", "merge")]
            png = engine.draw_timeline(str(tmp_path / "gantt.png"))
        assert {r["op"] for r in engine.timeline()} >= {"load", "encode", "decode", "merge", "send", "recv"}
        overlapping = [(a, b) for a in rows for b in rows
                       if a["actor"] != b["actor"] and a["bucket"] != b["bucket"]
                       and a["start"] < b["end"] and b["start"] < a["end"]]
        assert overlapping, "no two tensors' compute ops overlapped across actors"
        assert open(png, "rb").read(4) == b"\x89PNG"
        # each compute op's own CPU time (what calibration scales by) fits inside its wall time
        assert all(0 <= r["cpu"] <= r["end"] - r["start"] + 1e-3 for r in rows) and sum(r["cpu"] for r in rows) > 0

    def test_torch_in_torch_out(self, kept):
        torch = pytest.importorskip("torch")
        model = torch.nn.Linear(5, 3)
        plan = casync.build_plan(model, workers=2, strategy="ring", codec="none")
        grads = [{n: torch.full_like(p, float(r)) for n, p in model.named_parameters()} for r in range(2)]
        with kept(plan) as engine:
            out = engine.sync(grads)
        assert isinstance(out[1]["weight"], torch.Tensor)
        torch.testing.assert_close(out[1]["weight"], torch.full((3, 5), 0.5))

    def test_bad_input_rejected_before_submission_engine_stays_usable(self, kept):
        plan = casync.build_plan({"a": (10,)}, workers=2, strategy="ring", codec="onebit")
        with kept(plan) as engine:
            with pytest.raises(ValueError, match="worker 1.*'a'.*shape"):
                engine.sync([{"a": np.zeros(10, np.float32)}, {"a": np.zeros(11, np.float32)}])
            out = engine.sync(make_grads({"a": (10,)}, 2))
            assert engine.step == 1 and out[0]["a"].shape == (10,)


def _check_three_syncs_against_local_engine(plan, engine):
    """Three syncs of ``engine`` give LocalEngine's bits in fresh writable arrays, and the same state after."""
    workers, local = plan.workers, casync.LocalEngine(plan)
    for step in range(3):  # several steps: error-feedback state must evolve identically
        grads = make_grads(SHAPES, workers, seed=step)
        expected, got = local.sync(grads), engine.sync(grads)
        for w in range(workers):
            for name in SHAPES:
                np.testing.assert_array_equal(got[w][name], expected[w][name], err_msg=f"{name} worker {w}")
                assert got[w][name].flags.writeable
    ray_state, local_state = engine.state_dict(), local.state_dict()
    assert ray_state["step"] == local_state["step"] == 3
    assert ray_state["residuals"].keys() == local_state["residuals"].keys()
    for key, value in local_state["residuals"].items():
        np.testing.assert_array_equal(ray_state["residuals"][key], value)


def test_compute_threads_keep_results_bitwise(ray_local):
    """Actors running two ops at once give LocalEngine's results and residuals, step after step."""
    plan = casync.build_plan(SHAPES, workers=3, strategy="ps", codec="onebit", bucket_bytes=512, partitions=2)
    local = casync.LocalEngine(plan)
    with RayEngine(plan, timeout_s=60, compute_threads=2) as engine:
        for step in range(3):
            grads = make_grads(SHAPES, 3, seed=step)
            expected, got = local.sync(grads), engine.sync(grads)
            for w in range(3):
                for name in SHAPES:
                    np.testing.assert_array_equal(got[w][name], expected[w][name], err_msg=f"{name} worker {w}")
        for key, value in local.state_dict()["residuals"].items():
            np.testing.assert_array_equal(engine.state_dict()["residuals"][key], value)


def test_results_come_through_shared_memory_and_stay_the_callers(ray_local):
    """Workers on the driver's machine hand results over in shared memory they reuse every sync: each sync
    still returns fresh writable arrays (the next sync never changes them), LocalEngine's bits, and no
    segment is left named in /dev/shm, running or closed."""
    import os

    def ours():  # this driver's segments (their names start with its pid): other processes' come and go meanwhile
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"casync{os.getpid()}")}

    before = ours()
    plan = casync.build_plan(SHAPES, workers=3, strategy="ring", codec="onebit", bucket_bytes=2048)
    local = casync.LocalEngine(plan)
    with RayEngine(plan, timeout_s=60) as engine:
        assert engine.shared_results == ["worker:0", "worker:1", "worker:2"]
        # no CPUs reserved (the default): one op at a time (test_compute_threads_follow_the_cpus_each_actor_reserves)
        assert engine.compute_threads == 1 and _threads_of(engine) == [1, 1, 1]
        assert ours() == before
        kept = []
        for step in range(3):
            grads = make_grads(SHAPES, 3, seed=step)
            expected, got = local.sync(grads), engine.sync(grads)
            kept.append((got, [{n: np.array(t) for n, t in g.items()} for g in got]))
            for w in range(3):
                for name in SHAPES:
                    np.testing.assert_array_equal(got[w][name], expected[w][name], err_msg=f"{name} worker {w}")
        for got, copy in kept:
            for w in range(3):
                for name in SHAPES:
                    np.testing.assert_array_equal(np.asarray(got[w][name]), copy[w][name])
    assert ours() == before


def test_actors_on_one_machine_need_no_process_group_nor_torch(ray_local):
    """On one machine the default transport is shared memory and Unix sockets: the actors form no process group
    (no port), never import torch (about 1.7 s of an actor's start here), and a dead one is seen at once."""
    import sys

    from casync.errors import WorkerLostError

    plan = casync.build_plan(SHAPES, workers=3, strategy="ps", codec="onebit", bucket_bytes=2048)
    with RayEngine(plan, timeout_s=30) as engine:
        assert engine.interfaces == {a: "" for a in plan.actors}
        engine.sync(make_grads(SHAPES, 3, seed=0))
        imported = ray.get([h.__ray_call__.remote(lambda self: "torch" in sys.modules) for h in engine.actors.values()])
        assert imported == [False] * len(plan.actors)
        ray.kill(engine.actors["worker:2"])
        t0 = time.monotonic()
        with pytest.raises(WorkerLostError):
            engine.sync(make_grads(SHAPES, 3, seed=1))
        assert time.monotonic() - t0 < 15  # half the engine's timeout: the dead peer is seen, not waited out


def test_actors_of_an_fp16_plan_cast_through_torch_on_one_thread(ray_local):
    """NumPy casts to float16 at a tenth of PyTorch's speed: actors whose plan has fp16 load torch for it (one
    intra-op thread, as every op runs on one core), and give LocalEngine's bits.  The plan is fp16's cell of
    test_bitwise_identical_to_local_engine (one-way PS on a dedicated server), checked here in full: each actor
    that loads torch costs ~1.7 s to start, so fp16 starts one engine, not two."""
    import sys

    plan = casync.build_plan(SHAPES, workers=2, strategy="ps", codec="fp16", bucket_bytes=2048, servers=1,
                             two_way=False)
    with RayEngine(plan, timeout_s=60) as engine:
        loaded = ray.get([h.__ray_call__.remote(lambda self: "torch" in sys.modules and sys.modules["torch"]
                                                 .get_num_threads()) for h in engine.actors.values()])
        _check_three_syncs_against_local_engine(plan, engine)
    assert loaded == [1] * len(plan.actors) and len(plan.actors) == 3  # the server too


def test_compute_threads_follow_the_cpus_each_actor_reserves(ray_local):
    """By default an actor runs one op per whole CPU it reserves (Ray's own rule for OMP_NUM_THREADS).  (No CPUs
    reserved, the default: test_results_come_through_shared_memory_and_stay_the_callers checks its engine.)"""
    plan = casync.build_plan(SHAPES, workers=2, strategy="ring", codec="onebit")

    with RayEngine(plan, timeout_s=60, num_cpus_per_actor=2) as engine:
        assert engine.compute_threads == 2 and _threads_of(engine) == [2, 2]
    with RayEngine(plan, timeout_s=60, num_cpus_per_actor=2, compute_threads=1) as engine:
        assert _threads_of(engine) == [1, 1]  # an explicit count wins
    for cpus, transport in ((0.5, "direct"), (2, "objectstore")):
        with RayEngine(plan, timeout_s=60, num_cpus_per_actor=cpus, transport=transport) as engine:
            assert engine.compute_threads == 1, (cpus, transport)


def _threads_of(engine):
    """The ops each actor of ``engine`` runs at once, as the actors have it."""
    return ray.get([a.__ray_call__.remote(lambda self: self.compute_threads) for a in engine.actors.values()])


def test_compute_threads_are_checked(ray_local):
    plan = casync.build_plan(SHAPES, workers=2, strategy="ring", codec="onebit")
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="compute_threads"):
            RayEngine(plan, compute_threads=bad)
    with pytest.raises(ValueError, match="direct data plane"):
        RayEngine(plan, compute_threads=2, transport="objectstore")


def test_killed_worker_raises_typed_error_and_resume_from_state(ray_local):
    import ray

    shapes = {"a": (5000,), "b": (300,)}
    plan = casync.build_plan(shapes, workers=3, strategy="ring", codec="onebit")
    steps = [make_grads(shapes, 3, seed=s) for s in range(4)]
    reference = casync.LocalEngine(plan)
    expected = [reference.sync(g) for g in steps]

    engine = RayEngine(plan, timeout_s=20)
    try:
        engine.sync(steps[0])
        engine.sync(steps[1])
        checkpoint = engine.state_dict()
        ray.kill(engine.actors["worker:1"], no_restart=True)
        t0 = time.monotonic()
        with pytest.raises(casync.WorkerLostError, match="worker:1"):
            engine.sync(steps[2])
        assert time.monotonic() - t0 < 20
        assert issubclass(casync.WorkerLostError, casync.SyncError)
        with pytest.raises(casync.SyncError, match="unusable"):
            engine.sync(steps[2])
    finally:
        engine.close()
    with RayEngine(plan, timeout_s=20) as fresh:
        fresh.load_state_dict(checkpoint)
        for i in (2, 3):
            out = fresh.sync(steps[i])
            for name in shapes:
                np.testing.assert_array_equal(out[2][name], expected[i][2][name])


def test_engine_reuses_running_ray_and_leaves_it_up(ray_local):
    plan = casync.build_plan({"a": (10,)}, workers=2)
    with RayEngine(plan):
        pass
    assert ray_local.is_initialized()


def test_embedded_ray_is_bound_to_loopback(ray_local):
    """The embedded Ray (address=None) advertises and serves on 127.0.0.1 only."""
    import ray

    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
