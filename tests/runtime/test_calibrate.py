"""Runtime calibration: the Ray runtime's costs in the profile, what the simulator does with them, fitting."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

import casync
from casync.runtime.calibrate import (fit_runtime, fit_thread_cpu, measure_dispatch, measure_run, measure_timelines,
                                     sync_span, task_spans)
from casync.schedule import compile_program
from casync.sim.costmodel import ClusterModel, LinearCost, Profile, RuntimeCosts
from casync.sim.simulator import simulate

RUNTIME = RuntimeCosts(compute_scale=3.0, task_gap_s=0.004, hop=LinearCost(0.005, 1e-10),
                       op_scale={"encode:onebit": 5.0})


def test_runtime_costs_round_trip_and_version_one_still_loads(tmp_path):
    profile = Profile.default().with_runtime(RUNTIME)
    again = Profile.load(profile.save(tmp_path / "p.json"))
    assert again.runtime == RUNTIME
    remote = replace(RUNTIME, remote_hop=LinearCost(0.012, 0.0))
    assert Profile.load(profile.with_runtime(remote).save(tmp_path / "r.json")).runtime == remote
    threads = replace(RUNTIME, plane="direct", message_cpu_s=3e-4, copy_cpu={"shm": 1e-10, "gloo": 5e-10},
                      sync_cpu_s=2e-3, backward_cores=0.8)
    assert Profile.load(profile.with_runtime(threads).save(tmp_path / "m.json")).runtime == threads
    assert profile.with_runtime(threads).message_cpu_s(10**6) == pytest.approx(3e-4 + 1e-4)
    assert profile.with_runtime(threads).message_cpu_s(10**6, same_node=False) == pytest.approx(3e-4 + 5e-4)
    assert profile.with_runtime(threads).sync_cpu_s == 2e-3 and again.sync_cpu_s == 0.0
    per_sync = replace(RUNTIME, plane="direct", sync_cpu_s=1e-3)  # each is saved without the other
    assert Profile.load(profile.with_runtime(per_sync).save(tmp_path / "s.json")).runtime == per_sync
    assert again.message_cpu_s(10**6) == 0.0 and Profile.default().message_cpu_s(10**6) == 0.0
    assert again.encode_s("onebit", 10**6) == pytest.approx(5.0 * Profile.default().encode_s("onebit", 10**6))
    assert again.decode_s("onebit", 10**6) == pytest.approx(3.0 * Profile.default().decode_s("onebit", 10**6))
    assert again.encode_s("onebit", 10**6, runtime=False) == Profile.default().encode_s("onebit", 10**6)
    old = Profile.default().to_dict()
    old["version"] = 1
    (tmp_path / "v1.json").write_text(json.dumps(old))
    assert Profile.load(tmp_path / "v1.json").runtime is None


@pytest.mark.parametrize("runtime,match", [
    ({"compute_scale": 0, "task_gap_s": 0, "hop": [0, 0]}, "compute_scale"),
    ({"compute_scale": 1, "task_gap_s": -1, "hop": [0, 0]}, "task_gap_s"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [1]}, "hop"),
    ({"compute_scale": 1, "task_gap_s": 0}, "hop"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "op_scale": {"merge": "x"}}, "op_scale"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "dispatch_s": -1}, "dispatch_s"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "remote_hop": [0.001]}, "remote_hop"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "remote_hop": [float("nan"), 0]}, "remote_hop"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "message_cpu": [1e-3, 0]}, "version 2's"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "message_cpu_s": -1e-3}, "message_cpu_s"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "copy_cpu": {"ib": 1e-10}}, "copy_cpu"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "copy_cpu": {"shm": "x"}}, "copy_cpu.shm"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "backward_cores": -1}, "backward_cores"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "transport": "carrier pigeon"}, "transport"),
    ({"compute_scale": 1, "task_gap_s": 0, "hop": [0, 0], "sync_cpu_s": float("inf")}, "sync_cpu_s"),
])
def test_malformed_runtime_is_rejected(runtime, match):
    data = Profile.default().to_dict()
    data["runtime"] = runtime
    with pytest.raises(ValueError, match=match):
        Profile.from_dict(data)


def test_network_links_cost_bytes_over_bandwidth_plus_latency_not_the_object_store_alpha():
    plan = casync.build_plan({"w": (1_000_000,)}, workers=2, strategy="ps", servers=1, codec=None)
    cluster = ClusterModel(nodes=2, workers_per_node=1, bandwidth_gbps=8, latency_us=100)
    tl = simulate(plan, cluster)
    for r in tl.records:
        if r["op"] == "recv" and r["actor"] == "server:0" and r["bucket"] == "w":
            sender = plan.graph.nodes[next(plan.graph.predecessors(r["node"]))]["actor"]
            if sender == "worker:1":  # the worker on the other node
                assert r["end"] - r["start"] == pytest.approx(4e6 / 1e9 + 100e-6, rel=1e-6)
                break
    else:
        pytest.fail("no cross-node recv found")


def test_a_calibrated_runtime_slows_ops_adds_task_gaps_and_hop_latency():
    plan = casync.build_plan("resnet50", workers=2, strategy="ring", codec="onebit")
    cluster = ClusterModel(nodes=1, workers_per_node=2)
    ideal = simulate(plan, cluster, Profile.default())
    slow = simulate(plan, cluster, Profile.default().with_runtime(RUNTIME))
    enc = {r["node"]: r["end"] - r["start"] for r in ideal.records if r["op"] == "encode"}
    enc_slow = {r["node"]: r["end"] - r["start"] for r in slow.records if r["op"] == "encode"}
    # each encode costs 5x its profiled time, plus the task gap when it opens a fused task
    o = Profile.default().task_cost_s
    for node, t in enc.items():
        assert (enc_slow[node] == pytest.approx(5.0 * t, rel=1e-6)
                or enc_slow[node] == pytest.approx(5.0 * (t - o) + RUNTIME.task_gap_s, rel=1e-6))
    # within a node a payload waits the hop latency after the sender's copy into the object store
    for r in slow.records:
        if r["op"] == "recv":
            send = next(x for x in slow.records if x["node"] == next(plan.graph.predecessors(r["node"])))
            assert r["end"] - send["end"] == pytest.approx(RUNTIME.hop(r["nbytes"]), rel=1e-6)
            assert send["end"] - send["start"] == pytest.approx(r["nbytes"] / Profile.default().transfer_beta_bps)
    assert slow.sync_time() > 2 * ideal.sync_time()


def test_fit_runtime_reads_measured_timelines(ray_local):
    # two buckets: each actor starts with two tasks whose only input is its own gradient, so every step has
    # a task gap whatever the timing (with one bucket a loaded machine could leave none to fit)
    plans = [casync.build_plan([("a", (300_000,)), ("b", (200_000,))], workers=2, strategy=s, codec=c,
                               bucket_bytes=1 << 20)
             for s, c in (("ring", "onebit"), ("allgather", "topk:ratio=0.01"))]
    assert all(len(p.buckets) == 2 for p in plans)
    runs = [(p, measure_timelines(p, iters=3)) for p in plans]
    for plan, steps in runs:
        assert len(steps) == 3 and all(sync_span(rows) > 0 for rows in steps)
        spans = task_spans(compile_program(plan), steps[0])
        assert len(spans) == len(compile_program(plan).tasks)
        assert all(s.end >= s.start for s in spans)
        assert any(s.input_ready is not None for s in spans)  # ring hops feed later tasks
    runtime = fit_runtime(runs, Profile.default(), cores=2)
    assert runtime.compute_scale >= 1.0 and math.isfinite(runtime.compute_scale)
    assert 0 <= runtime.task_gap_s < 1.0 and 0 <= runtime.hop.a < 1.0
    assert runtime.samples["gaps"] > 0 and runtime.samples["hops"] >= 1
    # the calibrated simulation charges what was fitted: more than the same runtime without its gaps and hops
    # (not necessarily more than the ideal runtime, whose per-hop copy a fast machine can beat)
    one_node = ClusterModel(nodes=1, workers_per_node=2, cores_per_node=2)
    predicted = simulate(plans[0], one_node, Profile.default().with_runtime(runtime)).sync_time()
    free = replace(runtime, task_gap_s=0.0, hop=LinearCost(0.0, 0.0))
    assert predicted > simulate(plans[0], one_node, Profile.default().with_runtime(free)).sync_time()
    # the same runs read as if each worker had been on its own node: every hop is between nodes, fitted
    # beyond the link's own time, and a cross-node payload then waits that instead of the local hop
    two_nodes = ClusterModel(nodes=2, workers_per_node=1, bandwidth_gbps=10.0, latency_us=50.0)
    remote = fit_runtime(runs, Profile.default(), cores=2, cluster=two_nodes)
    assert remote.samples["remote_hops"] == runtime.samples["hops"] and remote.samples["hops"] == 0
    assert remote.remote_hop is not None and remote.remote_hop.b == 0.0
    assert 0 <= remote.remote_hop.a < 1.0
    calibrated = Profile.default().with_runtime(remote)
    assert calibrated.link_s(1000, False, two_nodes) == pytest.approx((1000 / two_nodes.bytes_per_s,
                                                                       50e-6 + remote.remote_hop.a))
    assert calibrated.link_s(1000, True, two_nodes) == (0.0, remote.hop(1000))
    dispatch = measure_dispatch(iters=3, tensors=8)
    assert 0 < dispatch < 0.1  # CPU seconds per task of the driver and Ray's processes
    with pytest.raises(ValueError, match="not enough"):
        fit_runtime(runs, Profile.default(), cores=0)  # no run is uncontended on zero cores


def test_fit_direct_runtime_reads_the_executors_timelines(ray_local):
    """On the direct data plane: an op gap (the executor's own cost per op) and a hop from each send's issue
    to its receiver noticing it, fitted from real RayEngine timelines; the calibrated simulator charges them."""
    from casync.runtime.calibrate import calibration_plans, fit_direct_runtime

    plans = calibration_plans(workers=2, configs=(("ring", "onebit"),))
    measured = [(plan, measure_run(plan, iters=2, transport="direct")) for plan in plans]
    runs = [(plan, m.steps) for plan, m in measured]
    unfitted = fit_direct_runtime(runs, Profile.default())  # no process CPU: not fitted
    assert unfitted.copy_cpu == {} and unfitted.message_cpu_s == 0.0
    cpu = [m.process_cpu_s for _, m in measured]
    assert set(cpu[0]) == {"worker:0", "worker:1"} and all(0 < s < 10 for s in cpu[0].values())
    runtime = fit_direct_runtime(runs, Profile.default(), process_cpu=cpu)
    assert runtime.plane == "direct" and runtime.task_gap_s == 0.0
    assert set(runtime.copy_cpu) == {"shm"} and runtime.message_cpu_s >= 0 and runtime.copy_cpu["shm"] >= 0
    assert 0 <= runtime.op_gap_s < 0.5 and runtime.samples["gaps"] > 0 and runtime.samples["hops"] > 0
    assert runtime.hop.a >= 0 and runtime.hop.b >= 0
    profile = Profile.default().with_runtime(runtime)
    assert profile.store_s(1 << 20) == 0.0  # the direct plane's copy is in the hop, not on the sender's lane
    cluster = ClusterModel(nodes=1, workers_per_node=2)
    # the same fitted op scales without the gaps, hops and message CPU: those are charged on top (against the ideal
    # runtime itself the sum may go either way, as measured ops may run faster than the packaged profile's)
    free = replace(runtime, op_gap_s=0.0, hop=LinearCost(0.0, 0.0), message_cpu_s=0.0, copy_cpu={})
    assert (simulate(plans[0], cluster, profile).iteration_time
            > simulate(plans[0], cluster, Profile.default().with_runtime(free)).iteration_time)
    assert RuntimeCosts.from_dict(runtime.to_dict(), "test") == runtime


def _rows(actor: str, sends: list[int], op_cpu: float, peer: str = "worker:1") -> list[dict]:
    """One step's records of an actor: an encode taking ``op_cpu`` of CPU, and a send to ``peer`` per size in
    ``sends``."""
    return ([dict(op="encode", actor=actor, cpu=op_cpu, nbytes=0)]
            + [dict(op="send", actor=actor, cpu=1e-5, nbytes=n, peer=peer) for n in sends])


def test_fit_thread_cpu_recovers_the_cost_per_sync_message_and_byte():
    """What an actor's process spends beyond its ops is a constant per sync plus ``a`` per message sent plus
    ``b`` per byte, recovered from runs that differ in messages and in their sizes; the compute ops' own CPU
    and the executor's per-op gap are not counted; a single run is reproduced, never with a negative cost."""
    sync, a, b, gap = 3e-3, 4e-4, 2e-10, 1e-5
    runs, cpu = [], []
    for sizes in ([1 << 20] * 10, [1 << 14] * 30, [1 << 24] * 4):
        steps = [_rows("worker:0", sizes, 0.02) + _rows("worker:1", sizes, 0.03, "worker:0") for _ in range(3)]
        runs.append((None, steps))
        cpu.append({w: own + gap + sync + len(sizes) * a + sum(sizes) * b
                    for w, own in (("worker:0", 0.02), ("worker:1", 0.03))})
    fitted_sync, per_message, copy = fit_thread_cpu(runs, cpu, op_gap_s=gap)
    assert fitted_sync == pytest.approx(sync, rel=1e-6)
    assert per_message == pytest.approx(a, rel=1e-6) and copy == {"shm": pytest.approx(b, rel=1e-6)}
    one_sync, one_message, one_copy = fit_thread_cpu(runs[:1], cpu[:1], op_gap_s=gap)
    assert min(one_sync, one_message, one_copy["shm"]) >= 0
    assert one_sync + 10 * (one_message + one_copy["shm"] * (1 << 20)) == pytest.approx(
        sync + 10 * a + 10 * (1 << 20) * b)
    assert fit_thread_cpu(runs[1:2], [{w: 0.0 for w in cpu[1]}], op_gap_s=gap) == (0.0, 0.0, {"shm": 0.0})
    with pytest.raises(ValueError, match="entries for"):
        fit_thread_cpu(runs, cpu[:2])
    with pytest.raises(ValueError, match="no messages"):
        fit_thread_cpu([(None, [_rows("worker:0", [], 0.01)])], [{"worker:0": 0.1}])


def test_fit_thread_cpu_tells_shared_memory_copies_from_gloos():
    """Messages within a node go through shared memory, between nodes through gloo (the direct plane) or TCP
    (``tcp``): each kind's CPU per byte is fitted from the bytes each actor sends through it."""
    sync, a, shm, gloo = 2e-3, 1e-4, 1e-10, 6e-10
    cluster = ClusterModel(nodes=2, workers_per_node=2)  # workers 0, 1 on node 0; 2, 3 on node 1
    runs, cpu = [], []
    for near, far in (([1 << 20] * 8, [1 << 20] * 2), ([1 << 16] * 20, [1 << 22] * 6), ([1 << 22] * 3, [1 << 14] * 9),
                      ([1 << 18] * 5, [1 << 18] * 5)):
        steps = [_rows("worker:0", near, 0.01, "worker:1") + _rows("worker:0", far, 0.0, "worker:2")[1:]]
        runs.append((None, steps))
        cpu.append({"worker:0": 0.01 + sync + (len(near) + len(far)) * a + sum(near) * shm + sum(far) * gloo})
    _, per_message, copy = fit_thread_cpu(runs, cpu, cluster=cluster)
    assert per_message == pytest.approx(a, rel=1e-6)
    assert copy == {"shm": pytest.approx(shm, rel=1e-6), "gloo": pytest.approx(gloo, rel=1e-6)}
    _, _, over_tcp = fit_thread_cpu(runs, cpu, cluster=cluster, transport="tcp")
    assert set(over_tcp) == {"shm", "tcp"}
    profile = Profile.default().with_runtime(replace(RUNTIME, plane="direct", message_cpu_s=a, copy_cpu=copy))
    assert profile.message_cpu_shares(1 << 20, same_node=False) == pytest.approx(
        ((a + gloo * (1 << 20)) / 2,) * 2)


def test_thread_cpu_takes_the_cores_the_ops_need():
    """A direct plane's threads burn CPU per message and per sync: where the cluster models cores, the ops
    wait for it (the sync takes longer); with no cores modelled only the hop's latency counts."""
    plan = casync.build_plan([("a", (2_000_000,)), ("b", (1_000_000,))], workers=4, strategy="ring", codec="none")
    direct = replace(RUNTIME, plane="direct")
    base = Profile.default().with_runtime(direct)
    busy = Profile.default().with_runtime(replace(direct, message_cpu_s=1e-3, copy_cpu={"shm": 1e-9}))
    per_sync = Profile.default().with_runtime(replace(direct, sync_cpu_s=0.05))
    cores = ClusterModel(nodes=1, workers_per_node=4, cores_per_node=2)
    free = ClusterModel(nodes=1, workers_per_node=4)
    assert simulate(plan, free, busy).iteration_time == simulate(plan, free, base).iteration_time
    slower = simulate(plan, cores, busy).iteration_time - simulate(plan, cores, base).iteration_time
    assert slower > 1e-3
    assert simulate(plan, free, per_sync).iteration_time == simulate(plan, free, base).iteration_time
    # 4 actors' 50 ms on 2 cores: at least 100 ms more than without, but not every op waits for it
    assert 0.1 - 1e-9 <= simulate(plan, cores, per_sync).iteration_time - simulate(plan, cores, base).iteration_time
    two_nodes = ClusterModel(nodes=2, workers_per_node=2, cores_per_node=1)  # half on each end's node
    assert simulate(plan, two_nodes, busy).iteration_time > simulate(plan, two_nodes, base).iteration_time


def test_actors_report_their_cpu_time_and_thread_names(ray_local):
    """What calibration and benchmarks/sync_window_cpu.py read from an actor: its process CPU seconds (rising
    with a sync), its Python threads' native ids and names (the executor's lanes among them) and the thread
    its calls run in."""
    import ray

    from casync.engines.inputs import flatten_worker_grads, random_grads
    from casync.runtime.ray_engine import RayEngine

    plan = casync.build_plan([("a", (200_000,))], workers=2, strategy="ring", codec="onebit")
    flats, _ = flatten_worker_grads(plan, random_grads(plan))
    with RayEngine(plan, timeout_s=60) as engine:
        actor = engine.actors["worker:0"]
        before = ray.get(actor.cpu_seconds.remote())
        engine.run_flat(flats)
        assert ray.get(actor.cpu_seconds.remote()) > before
        names = ray.get(actor.thread_names.remote())
        assert "MainThread" in names.values() and all(isinstance(t, int) for t in names)
        assert any(n.startswith("casync-send-worker:0->") for n in names.values())
        assert names[ray.get(actor.call_thread.remote())] == "MainThread"  # no concurrency groups: Ray's main loop
