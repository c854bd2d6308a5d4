"""benchmarks/ray_breakdown.py and benchmarks/ray_vs_gloo.py: the span breakdown adds up and attributes idle
time to what the next call waited for; on a real RayEngine every op lands in a Ray call.  No timing asserts."""
from __future__ import annotations

import sys
import time

import pytest

from tests.helpers import load_benchmark

rb = load_benchmark("ray_breakdown")


def test_one_actor_lane_is_cut_into_categories_that_add_up():
    first = rb.RayTask("a", "run", created=0.5, submitted=0.8, start=1.0, end=6.5, deserialize=(1.0, 2.0),
                       execute=(2.0, 5.0), store=(5.0, 6.0))
    second = rb.RayTask("a", "run", created=0.6, submitted=7.0, start=8.0, end=9.0, execute=(8.2, 8.8))
    second.deps = [first]
    rows = [{"op": "encode", "start": 2.5, "end": 4.5, "cpu": 1.5},
            {"op": "recv", "start": 0.0, "end": 8.3, "cpu": 0.0},  # a recv row starts at its send: not op time
            {"op": "merge", "start": 8.4, "end": 8.6, "cpu": 0.2}]
    out = rb.actor_breakdown(rows, [second, first], (0.0, 10.0))
    expect = {"op_cpu": 1.7, "op_wait": 0.5, "op_blocked": 0.0, "deserialize": 1.0, "store": 1.0,
              "between_ops": 1.0 + 0.4, "task_loop": 0.5 + 0.4, "wait_inputs": 0.0, "submission": 0.5,
              "owner": 0.3 + 0.5, "delivery": 0.2 + 1.0, "tail": 1.0}
    assert out == pytest.approx(expect)
    assert sum(out.values()) == pytest.approx(10.0)


def test_an_ops_wall_beyond_its_cpu_is_split_into_waiting_for_a_core_and_blocked_prorated_when_clipped():
    call = rb.RayTask("a", "run", created=0.0, submitted=0.0, start=0.0, end=10.0, execute=(0.0, 10.0))
    rows = [{"op": "encode", "start": 1.0, "end": 3.0, "cpu": 1.0, "queued": 0.4},
            {"op": "merge", "start": 5.0, "end": 9.0, "cpu": 2.0, "queued": 1.2}]  # the span ends at 7: half of it
    out = rb.actor_breakdown(rows, [call], (0.0, 7.0))
    assert out["op_cpu"] == pytest.approx(1.0 + 1.0)
    assert out["op_wait"] == pytest.approx(0.4 + 0.6)
    assert out["op_blocked"] == pytest.approx(0.6 + 0.4)
    assert sum(out.values()) == pytest.approx(7.0)
    direct = rb.executor_breakdown([dict(r, actor="worker:0") for r in rows], calls=1)["per_actor"]["worker:0"]
    assert (direct["op_cpu"], direct["op_wait"], direct["op_blocked"]) == pytest.approx((3.0, 1.6, 1.4))
    assert sum(direct.values()) == pytest.approx(8.0)
    unread = rb.executor_breakdown([dict(r, actor="worker:0", queued=None) for r in rows], calls=1)["mean"]
    assert (unread["op_wait"], unread["op_blocked"]) == (pytest.approx(3.0), 0.0)  # no schedstat: as before


def test_idle_time_before_a_call_waits_first_for_its_inputs_and_everything_is_clipped_to_the_span():
    producer = rb.RayTask("b", "run", created=0.0, submitted=0.0, start=0.0, end=4.0)
    call = rb.RayTask("a", "run", created=0.1, submitted=4.6, start=5.0, end=7.0, execute=(5.5, 6.5))
    call.deps = [producer]
    out = rb.actor_breakdown([], [call], (1.0, 6.0))  # the span cuts the call in the middle of its body
    assert out["wait_inputs"] == pytest.approx(3.0)  # 1 -> 4: the producer still running
    assert out["submission"] == 0.0  # created long before
    assert out["owner"] == pytest.approx(0.6) and out["delivery"] == pytest.approx(0.4)  # pushed at 4.6
    assert out["task_loop"] == pytest.approx(0.5) and out["between_ops"] == pytest.approx(0.5)
    assert sum(out.values()) == pytest.approx(5.0)
    assert rb.actor_breakdown([], [], (1.0, 6.0))["wait_inputs"] == pytest.approx(5.0)  # no calls at all


def test_the_timeline_is_placed_on_rays_clock_by_the_least_delayedload_benchmark():
    # worker:0 read its clock 10 us into its load call; worker:1 was preempted 7 ms before reading it
    calls = [rb.RayTask("a0", "load", 0.0, 0.0, 99.99, 100.02, execute=(99.99999, 100.01)),
             rb.RayTask("a1", "load", 0.0, 0.0, 100.0, 100.03, execute=(100.001, 100.02))]
    rows = [{"op": "load", "actor": "worker:0", "start": 0.0, "end": 0.009},
            {"op": "load", "actor": "worker:1", "start": 0.008, "end": 0.018},
            {"op": "encode", "actor": "worker:0", "start": 0.05, "end": 0.06}]
    placed = rb.absolute_rows(rows, calls, {"worker:0": "a0", "worker:1": "a1"})
    assert placed[0]["start"] == pytest.approx(100.0, abs=2e-5)
    assert placed[2]["start"] - placed[0]["start"] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="do not fit"):  # a row longer than its call cannot be placed
        rb.absolute_rows([dict(rows[0], end=0.5)], calls[:1], {"worker:0": "a0"})


def test_a_real_ray_engine_sync_is_fully_attributed(ray_local):
    import casync
    from casync.bench.measure import sync_span
    from casync.engines.inputs import flatten_worker_grads, random_grads
    from casync.runtime.ray_engine import RayEngine

    plan = casync.build_plan("tiny", workers=3, strategy="ring", codec="onebit")
    flats, _ = flatten_worker_grads(plan, random_grads(plan))
    with RayEngine(plan, timeout_s=60, transport="objectstore") as engine:
        ids = {name: handle._actor_id.hex() for name, handle in engine.actors.items()}
        engine.run_flat(flats)
        t0 = time.time()
        engine.run_flat(flats)
        t1 = time.time()
        rows = engine.timeline(engine.step - 1)
        time.sleep(2.5)  # task events reach the GCS about once a second
        tasks, submits = rb.ray_tasks(ids.values(), t0, t1)
        result = rb.sync_breakdown(rows, tasks, ids, engine.program)
        calls = len(engine.program.tasks)
    assert result["calls"] == calls and result["matched"] == result["ops"] == len(plan.graph)
    assert submits  # the driver's submit_task intervals
    assert result["span_s"] == pytest.approx(sync_span(rows))
    for name, parts in result["per_actor"].items():
        assert set(parts) == set(rb.CATEGORIES)
        assert all(v >= 0 for v in parts.values()), (name, parts)
        assert sum(parts.values()) == pytest.approx(result["span_s"], rel=1e-9)
    assert result["per_actor"]["worker:0"]["op_cpu"] > 0


def test_transport_is_passed_only_to_an_engine_that_takes_one():
    import inspect

    from casync.runtime.ray_engine import RayEngine

    bench = load_benchmark("ray_vs_gloo")
    assert bench.engine_options(None) == {}
    if "transport" in inspect.signature(RayEngine).parameters:
        assert bench.engine_options("x") == {"transport": "x"}
    else:
        with pytest.raises(SystemExit, match="no transport parameter"):
            bench.engine_options("direct")


def test_cpu_sampler_reads_any_window_and_keeps_the_counters_of_a_process_that_exits():
    import os
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; t = time.process_time(); "
                              "exec('while time.process_time() - t < 0.05: pass')"])
    with rb.CpuSampler({"driver": [os.getpid()], "child": [child.pid]}, interval=0.005) as sampler:
        t0, start = time.time(), time.process_time()
        while time.process_time() - start < 0.1:  # burn some CPU in this process
            pass
        child.wait()
        time.sleep(0.05)  # samples after the child is gone
        t1 = time.time()
    window = sampler.between(t0, t1)
    assert window["driver"] > 0 and window["outside"] >= 0 and window["idle"] >= 0
    assert sampler.at(t1)["child"] >= sampler.at(t0)["child"] >= 0  # no drop to zero when it exited


def test_a_direct_data_plane_sync_is_fully_attributed(ray_local):
    """On the direct data plane (one call per actor) each actor's span splits into the executor's categories."""
    import casync
    from casync.bench.measure import sync_span
    from casync.engines.inputs import flatten_worker_grads, random_grads
    from casync.runtime.ray_engine import RayEngine

    plan = casync.build_plan("tiny", workers=3, strategy="ring", codec="onebit")
    flats, _ = flatten_worker_grads(plan, random_grads(plan))
    with RayEngine(plan, timeout_s=60, transport="direct") as engine:
        engine.run_flat(flats)
        rows = engine.timeline(engine.step - 1, relative=False)
        result = rb.executor_breakdown(rows, engine.calls_per_step)
    assert result["calls"] == 3 and result["span_s"] == pytest.approx(sync_span(rows))
    for name, parts in result["per_actor"].items():
        assert all(v >= 0 for v in parts.values()), (name, parts)
        assert sum(parts.values()) == pytest.approx(result["span_s"], rel=1e-9)
    assert result["mean"]["store"] == result["mean"]["delivery"] == 0  # nothing went through the object store
