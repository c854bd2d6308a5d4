"""Cost model files and the timeline simulator's behaviour."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

import casync
from casync.sim.costmodel import ClusterModel, LinearCost, Profile
from casync.sim.profiler import (MAX_FLUSH_BYTES, CacheFlusher, _Feedback, best_time, fit_linear,
                                 largest_cache_bytes, profile_codecs)
from casync.primitives.codecs import get_codec
from casync.sim.simulator import simulate


def test_default_profile_round_trips(tmp_path):
    profile = Profile.default()
    assert {"none", "onebit", "topk(ratio=0.01)"} <= set(profile.codecs)
    path = profile.save(tmp_path / "p.json")
    again = Profile.load(path)
    assert again.to_dict() == profile.to_dict()
    assert again.encode_s("topk(ratio=0.5)", 1000) == again.encode_s("topk(ratio=0.01)", 1000)  # name fallback


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(version=99), "version"),
    (lambda d: d.pop("merge"), "merge"),
    (lambda d: d.update(codecs={}), "codecs"),
    (lambda d: d["codecs"]["none"].update(encode=[1, -2]), "non-negative"),
    (lambda d: d.update(transfer_beta_bps=0), "transfer_beta_bps"),
])
def test_malformed_profiles_are_rejected(tmp_path, mutate, match):
    data = Profile.default().to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        Profile.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        Profile.load(path)


def test_fit_linear_recovers_a_line_and_profiling_runs():
    fit = fit_linear([1e3, 1e4, 1e5, 1e6], [1e-5 + 2e-9 * n for n in (1e3, 1e4, 1e5, 1e6)])
    assert fit.a == pytest.approx(1e-5, rel=1e-3) and fit.b == pytest.approx(2e-9, rel=1e-3)
    costs = profile_codecs(["onebit"], sizes=[2**10, 2**14], repeat=1)
    assert set(costs["onebit"]) == {"encode", "encode_ef", "decode", "deferred"}  # it decodes in blocks
    assert all(isinstance(c, LinearCost) and c.b >= 0 for c in costs["onebit"].values())
    sparse = profile_codecs(["topk:ratio=0.1"], sizes=[2**10, 2**14], repeat=1)  # and its entries into a merge
    assert set(sparse["topk(ratio=0.1)"]) == {"encode", "encode_ef", "decode", "entries"}


def test_profiled_randomk_ops_draw_their_indices_afresh(monkeypatch):
    """randomk keeps the indices it drew for a seed; the profile still times the draw in every timed call, as an
    actor's first use of a seed pays it."""
    import casync.primitives.codecs.sparse as sparse

    draws = []
    real = sparse._draw_indices
    monkeypatch.setattr(sparse, "_draw_indices", lambda n, k, seed: draws.append(n) or real(n, k, seed))
    profile_codecs(["randomk:ratio=0.1"], sizes=[2**12], repeat=2)
    assert len(draws) >= 8  # 2 timed calls each of encode, encode_ef, decode and entries


def test_profiled_ops_are_timed_cold_and_fault_in_no_fresh_memory():
    """The profile prices an op as a sync runs it: every timed call after a cache flush that is not timed, and
    error feedback writing each new residual where the one of two steps back was (no fresh pages)."""
    calls = []
    seconds = best_time(lambda: calls.append("op"), 3, before=lambda: (calls.append("flush"), time.sleep(0.05)))
    assert calls == ["op"] + ["flush", "op"] * 3 and seconds < 0.04
    assert CacheFlusher().buffer.nbytes == min(2 * largest_cache_bytes(), MAX_FLUSH_BYTES)
    feedback, x = _Feedback(5000), np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    kept = []
    for _ in range(4):
        feedback.encode(get_codec("onebit"), x)
        kept.append(id(feedback.residuals["k"]))
    assert kept[0] != kept[1] and kept[2:] == kept[:2]


def test_largest_cache_is_read_from_sysfs(tmp_path):
    for index, size in [(0, "48K"), (2, "2048K"), (3, "32768K\n")]:
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size)
    assert largest_cache_bytes(str(tmp_path)) == 32 << 20
    assert largest_cache_bytes(str(tmp_path / "missing"), default=123) == 123


@pytest.mark.parametrize("kwargs,match", [(dict(nodes=0), "nodes"), (dict(bandwidth_gbps=0), "bandwidth"),
                                          (dict(cores_per_node=0), "cores"), (dict(workers_per_node=1.5), "workers")])
def test_cluster_model_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClusterModel(**kwargs)


def test_slower_network_and_compression_move_time_as_expected():
    plan = casync.build_plan("resnet50", workers=4, strategy="ring", codec=None)
    fast = simulate(plan, ClusterModel.for_workers(4, bandwidth_gbps=100)).iteration_time
    slow = simulate(plan, ClusterModel.for_workers(4, bandwidth_gbps=1)).iteration_time
    assert slow > 5 * fast
    onebit = casync.build_plan("resnet50", workers=4, strategy="ring", codec="onebit")
    assert simulate(onebit, ClusterModel.for_workers(4, bandwidth_gbps=1)).iteration_time < slow / 5


def test_timeline_structure():
    plan = casync.build_plan("resnet50", workers=3, strategy="ps", servers=1, codec="onebit")
    tl = simulate(plan, ClusterModel(nodes=2, workers_per_node=2, bandwidth_gbps=10))
    assert len(tl.records) == plan.graph.number_of_nodes()
    assert tl.iteration_time == pytest.approx(max(r["end"] for r in tl.records))
    assert tl.critical_path and tl.critical_path[-1] in plan.graph
    assert all(plan.graph.nodes[n]["actor"] for n in tl.critical_path)
    # workers 0, 1 and server:0 (servers go round-robin from node 0) share node 0; worker:2 is on node 1:
    # only cross-node bytes are link bytes
    assert set(tl.bytes_per_link) == {("worker:2", "server:0"), ("server:0", "worker:2")}
    lanes = {r["lane"] for r in tl.records}
    assert {"worker:0/compute0", "server:0/egress", "worker:2/ingress"} <= lanes
    for lane in lanes:  # a lane never runs two ops at once
        spans = sorted((r["start"], r["end"]) for r in tl.records if r["lane"] == lane and r["op"] != "recv")
        assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_ready_times_delay_the_buckets_and_hide_communication():
    plan = casync.build_plan("resnet50", workers=4, strategy="ring", codec=None, bucket_bytes=4 << 20)
    cluster = ClusterModel.for_workers(4, bandwidth_gbps=10)
    base = simulate(plan, cluster)
    late = {t.name: 1.0 for t in plan.tensors}
    delayed = simulate(plan, cluster, ready_times=late)
    assert delayed.iteration_time == pytest.approx(1.0 + base.iteration_time, rel=0.01)
    with pytest.raises(ValueError, match="unknown"):
        simulate(plan, cluster, ready_times={"nope": 1.0})


def test_cores_per_node_models_contention():
    plan = casync.build_plan("resnet50", workers=4, strategy="allgather", codec="onebit")
    free = simulate(plan, ClusterModel(nodes=1, workers_per_node=4)).iteration_time
    shared = simulate(plan, ClusterModel(nodes=1, workers_per_node=4, cores_per_node=1)).iteration_time
    assert shared > 1.5 * free


def test_host_cores_make_emulated_nodes_share_one_machine():
    """Nodes emulated on one machine (benchmarks/netem): at most host_cores compute ops run at any moment."""
    plan = casync.build_plan("resnet50", workers=4, strategy="ring", codec="onebit")
    own = simulate(plan, ClusterModel(nodes=4, workers_per_node=1, bandwidth_gbps=1))
    shared = simulate(plan, ClusterModel(nodes=4, workers_per_node=1, bandwidth_gbps=1, host_cores=2))
    assert shared.iteration_time > own.iteration_time
    compute = [(r["start"], r["end"]) for r in shared.records if r["op"] in ("encode", "decode", "merge")]
    events = sorted([(s, 1) for s, e in compute if e > s] + [(e, -1) for s, e in compute if e > s])
    running, most = 0, 0
    for _, delta in events:  # ends sort before starts at the same instant
        running += delta
        most = max(most, running)
    assert most == 2
    with pytest.raises(ValueError, match="not both"):
        ClusterModel(nodes=4, workers_per_node=1, cores_per_node=1, host_cores=2)
    with pytest.raises(ValueError, match="host_cores"):
        ClusterModel(host_cores=0)


def test_timeline_draws(tmp_path):
    plan = casync.build_plan("tiny", workers=2, strategy="ring", codec="onebit")
    png = simulate(plan).draw(str(tmp_path / "sim.png"))
    assert open(png, "rb").read(4) == b"\x89PNG"


def test_gantt_draws_one_collection_per_op_kind_and_lane(tmp_path, monkeypatch):
    """A 16-worker plan has tens of thousands of ops: one matplotlib artist each took minutes to draw."""
    from matplotlib.axes import Axes

    calls = []
    real = Axes.broken_barh
    monkeypatch.setattr(Axes, "broken_barh", lambda self, xranges, yrange, **kw: (
        calls.append(len(xranges)), real(self, xranges, yrange, **kw))[1])
    plan = casync.build_plan("resnet50", workers=8, strategy="ps", codec="onebit")
    tl = simulate(plan, ClusterModel.for_workers(8))
    tl.draw(str(tmp_path / "big.png"))
    drawn = [r for r in tl.records if r["op"] != "wire"]
    assert sum(calls) == len(drawn)  # every op drawn
    assert len(calls) <= 5 * 8  # ... in one call per (op kind, worker)


@pytest.mark.parametrize("workers, per_node, strategy, codec", [
    (8, 4, "auto", "auto"),  # sends that held a compute lane were counted with their wire time: 47 ms of 37.5
    (8, 1, "ring", "onebit"),
    (6, 4, "ps", "none"),
])
def test_critical_path_seconds_never_exceed_the_iteration(workers, per_node, strategy, codec):
    cluster = ClusterModel.for_workers(workers, workers_per_node=per_node, bandwidth_gbps=25)
    plan = casync.build_plan("resnet50", workers=workers, strategy=strategy, codec=codec, cluster=cluster)
    tl = simulate(plan, cluster)
    split = tl.critical_path_seconds()
    assert set(split) == {"compute", "transfer"} and min(split.values()) >= 0
    assert 0.5 * tl.iteration_time < split["compute"] + split["transfer"] <= tl.iteration_time * (1 + 1e-9)


def test_a_registered_codec_is_simulated_and_planned_once_profiled_on_this_machine():
    """The README's "Adding a codec": the packaged profile has no costs for a new codec, and the error says
    how to measure them; a profile measured with it simulates and plans it."""
    from casync.primitives.codecs import Codec, register_codec, unregister_codec
    from casync.sim.profiler import DEFAULT_CODECS, profile

    class Halves(Codec):
        name = "halves-test"
        ef_sound = True

        def encode(self, x, seed=0):
            return {"h": x.astype(np.float16)}

        def decode(self, payload, n):
            return payload["h"].astype(np.float32)

        def compressed_nbytes(self, n):
            return 2 * n

    register_codec(Halves)
    try:
        plan = casync.build_plan({"w": (4096,), "b": (64,)}, workers=2, codec="halves-test")
        with pytest.raises(KeyError, match=r"no costs for codec 'halves-test'.*profile\(codecs="):
            simulate(plan)
        costs = profile(codecs=[*DEFAULT_CODECS[:1], "halves-test"], sizes=(1024, 4096), repeat=1, progress=False)
        assert simulate(plan, profile=costs).iteration_time > 0
        auto = casync.build_plan({"w": (4096,), "b": (64,)}, workers=2, strategy="auto",
                                 codec=["none", "halves-test"], profile=costs)
        assert {str(b.codec) for b in auto.buckets} <= {"none", "halves-test"}
    finally:
        unregister_codec("halves-test")
