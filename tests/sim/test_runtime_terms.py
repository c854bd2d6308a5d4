"""The runtime model's terms (profile version 3): each one, on a crafted profile, shows up in the simulated time
and in the planner's estimate; profiles written before version 3 still load."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import casync
from casync.sim.costmodel import PROFILE_VERSION, ClusterModel, LinearCost, Profile, RuntimeCosts, copy_kind
from casync.sim.simulator import simulate

DATA = Path(__file__).parent / "data"
DIRECT = RuntimeCosts(compute_scale=1.0, task_gap_s=0.0, hop=LinearCost(1e-4, 0.0), plane="direct")
ONE_NODE = ClusterModel(nodes=1, workers_per_node=4, cores_per_node=2)
TWO_NODES = ClusterModel(nodes=2, workers_per_node=2, cores_per_node=2, bandwidth_gbps=10)


def _plan(strategy: str = "ring", codec: str = "none"):
    return casync.build_plan([("a", (2_000_000,)), ("b", (1_000_000,))], workers=4, strategy=strategy, codec=codec,
                             bucket_bytes=1)  # a bucket per tensor


def _time(plan, cluster, **terms) -> float:
    return simulate(plan, cluster, Profile.default().with_runtime(replace(DIRECT, **terms))).iteration_time


def _bytes_sent(plan) -> int:
    return sum(plan.graph.nodes[n]["nbytes"] for n in plan.nodes(op="send"))


def test_copy_cpu_per_byte_takes_the_cores():
    """Shared memory's copies cost CPU per byte on the node's cores: a ring of 12 MB per sync over 4 workers on
    2 cores takes at least the copies' CPU over the cores longer; without cores modelled, nothing."""
    plan = _plan()
    per_byte = 2e-9
    slower = _time(plan, ONE_NODE, copy_cpu={"shm": per_byte}) - _time(plan, ONE_NODE)
    copies = _bytes_sent(plan) * per_byte
    assert copies / 2 * 0.5 < slower <= copies + 1e-9  # spread over 2 cores, some of it beside idle lanes
    free = ClusterModel(nodes=1, workers_per_node=4)
    assert _time(plan, free, copy_cpu={"shm": per_byte}) == _time(plan, free)


def test_copy_cpu_is_charged_by_what_the_message_goes_through():
    """Between nodes the direct plane goes through gloo: only gloo's per-byte price changes a two-node sync's
    messages between nodes, and on one node gloo's price changes nothing; a kind not calibrated costs as
    shared memory's."""
    plan = _plan()
    base = _time(plan, TWO_NODES, copy_cpu={"shm": 1e-10, "gloo": 1e-10})
    assert _time(plan, TWO_NODES, copy_cpu={"shm": 1e-10, "gloo": 3e-9}) > base + 1e-3
    shm_only = _time(plan, ONE_NODE, copy_cpu={"shm": 1e-10})
    assert _time(plan, ONE_NODE, copy_cpu={"shm": 1e-10, "gloo": 3e-9}) == shm_only
    assert _time(plan, TWO_NODES, copy_cpu={"shm": 1e-10}) == base
    assert [copy_kind(t, same) for t in ("direct", "tcp", "gloo") for same in (True, False)] == [
        "shm", "gloo", "shm", "tcp", "gloo", "gloo"]
    with pytest.raises(ValueError, match="objectstore"):
        copy_kind("objectstore", True)


def test_the_executors_cost_per_message_takes_the_cores():
    """``message_cpu_s`` per message whatever its size: ring on 4 workers sends 2(N-1) messages per partition."""
    plan = _plan()
    messages = len(list(plan.nodes(op="send")))
    slower = _time(plan, ONE_NODE, message_cpu_s=1e-3) - _time(plan, ONE_NODE)
    assert messages * 1e-3 / 2 * 0.5 < slower <= messages * 1e-3 + 1e-9


def test_the_executors_cost_per_op_is_on_every_compute_op():
    """``op_gap_s`` lengthens every compute op on its lane: one worker alone runs its ops back to back."""
    plan = casync.build_plan([("a", (100_000,))], workers=1, strategy="ring", codec="onebit")
    ops = sum(1 for _, op in plan.graph.nodes(data="op") if op in ("encode", "decode", "merge"))
    cluster = ClusterModel(nodes=1, workers_per_node=1)
    assert _time(plan, cluster, op_gap_s=1e-3) - _time(plan, cluster) == pytest.approx(ops * 1e-3)


def test_the_backward_takes_its_share_of_the_cores_while_buckets_arrive():
    """Buckets ready one after another mean a backward is running: each worker's takes ``backward_cores`` of the
    cores, its fair share beside its sync (4 workers with one core each of backward and of sync on 2 cores: a
    quarter of a core each), from the first ready time to the last; all ready together: no backward."""
    plan = _plan()
    ready = {"a": 0.0, "b": 0.002}
    profile = Profile.default().with_runtime(DIRECT)
    with_backward = profile.with_runtime(replace(DIRECT, backward_cores=1.0))
    assert with_backward.backward_share(2, 4) == pytest.approx(0.25) and with_backward.backward_share(16, 4) == 1.0
    slower = (simulate(plan, ONE_NODE, with_backward, ready_times=ready).iteration_time
              - simulate(plan, ONE_NODE, profile, ready_times=ready).iteration_time)
    assert 2e-4 < slower <= 4 * 0.25 * 0.002 + 1e-9  # 2 ms of CPU on 2 cores, partly where a lane was idle anyway
    assert simulate(plan, ONE_NODE, with_backward).iteration_time == simulate(plan, ONE_NODE, profile).iteration_time
    free = ClusterModel(nodes=1, workers_per_node=4)
    assert (simulate(plan, free, with_backward, ready_times=ready).iteration_time
            == simulate(plan, free, profile, ready_times=ready).iteration_time)


def test_the_planners_estimate_charges_the_same_terms():
    """The planner's Espresso timeline charges the backward's share on the pools of cores between ready times,
    and its estimator the messages' copies by kind: a plan's estimate grows with either."""
    from casync.planner.estimator import Estimator, Option
    from casync.planner.timeline import Timeline
    from casync.primitives.codecs import get_codec

    profile = Profile.default().with_runtime(DIRECT)
    option, numel = Option("ring", get_codec("none"), 4), 1_000_000
    est = Estimator(4, TWO_NODES, profile.with_runtime(replace(DIRECT, copy_cpu={"shm": 1e-9, "gloo": 4e-9})))
    cheap = Estimator(4, TWO_NODES, profile.with_runtime(replace(DIRECT, copy_cpu={"shm": 1e-9, "gloo": 1e-9})))
    assert est.remote_share == pytest.approx(2 / 3)
    assert est.cost(numel, option).work[-2:].sum() > cheap.cost(numel, option).work[-2:].sum()
    back = Estimator(4, ONE_NODE, profile.with_runtime(replace(DIRECT, backward_cores=1.0)))
    assert back.backward(0.1)[-1] == pytest.approx(4 * 0.25 * 0.1 / 2) and not back.backward(0.1)[:-1].any()
    assert not Estimator(4, ONE_NODE, profile).backward(0.1).any()
    costs = [back.cost(numel, option)] * 2
    plain, charged = (Timeline([0.0, 0.001], 4, back.R, fn).run(costs)[0] for fn in (None, back.backward))
    assert charged > plain
    assert Timeline([0.0, 0.0], 4, back.R, back.backward).run(costs)[0] == Timeline([0.0, 0.0], 4, back.R).run(costs)[0]


def test_a_merge_of_a_codecs_handed_decodes_has_a_scale_of_its_own():
    """A merge that adds a sparsifier's entries (or a block decoder's deferred decodes) itself is scaled by
    ``op_scale["merge:<codec>"]`` where calibration fitted one, else by the dense merges' ``"merge"``: only the
    randomk merges of an all-gather slow down, in the simulator and the planner's estimator alike."""
    from casync.planner.estimator import Estimator
    from casync.primitives.codecs import get_codec

    randomk, dense = _plan("allgather", "randomk:ratio=0.01"), _plan("ring", "none")
    scaled = {"op_scale": {"merge": 2.0, "merge:randomk": 6.0}}
    assert _time(randomk, ONE_NODE, **scaled) > _time(randomk, ONE_NODE, op_scale={"merge": 2.0}) + 1e-3
    assert _time(dense, ONE_NODE, **scaled) == _time(dense, ONE_NODE, op_scale={"merge": 2.0})
    profile = Profile.default().with_runtime(replace(DIRECT, **scaled))
    assert profile.merge_s(10**6, 1, codec_key="randomk(ratio=0.01)") == pytest.approx(3 * profile.merge_s(10**6, 1))
    assert profile.merge_s(10**6, 1, codec_key="topk(ratio=0.01)") == profile.merge_s(10**6, 1)  # not fitted: "merge"
    est = Estimator(4, ONE_NODE, profile)
    codec = get_codec("randomk:ratio=0.01")
    assert est.merge_decoded(10**6, 3, 1, codec) == pytest.approx(profile.merge_s(10**6, 1, codec_key=str(codec)))


def test_a_decode_that_is_no_output_costs_what_decode_shared_costs():
    """The executor runs a decode that is no output as ``Codec.decode_shared``: the identity's is its payload's own
    array, so an all-gather of ``none`` pays for its merge, not for N copies before it (measured: 3 ms of decodes
    where the simulator charged 126); an output decode still costs a decode, and a profile without ``shared``
    prices it as before."""
    from casync.sim.optable import KINDS, OpTable
    from casync.sim.profiler import shares_payload
    from casync.primitives.codecs import get_codec
    from tests.helpers import profile_without

    assert shares_payload(get_codec("none")) and not shares_payload(get_codec("onebit"))
    plan = _plan("allgather", "none")
    table = OpTable.from_graph(plan.graph)
    profile = Profile.default()
    durations = table.durations(profile)
    decodes = [(plan.graph.nodes[name], d) for name, k, d in zip(table.names, table.kind, durations)
               if KINDS[k] == "decode"]
    assert decodes and not any(a.get("output") for a, _ in decodes)  # the merge is the output
    assert all(d == pytest.approx(profile.shared_s("none", a["numel"])) for a, d in decodes)
    assert profile.shared_s("none", 10**6) < profile.decode_s("none", 10**6) / 10
    old = profile_without(profile, "shared")
    assert simulate(plan, ONE_NODE, old).iteration_time > simulate(plan, ONE_NODE, profile).iteration_time
    ring = _plan("ring", "none")  # its all-gather's decodes are outputs: whole decodes
    ring_table = OpTable.from_graph(ring.graph)
    outputs = [(ring.graph.nodes[name]["numel"], d) for name, k, d in
               zip(ring_table.names, ring_table.kind, ring_table.durations(profile))
               if KINDS[k] == "decode" and ring.graph.nodes[name].get("output")]
    assert outputs and all(d == pytest.approx(profile.decode_s("none", n), rel=1e-3) for n, d in outputs)


def test_profiles_from_before_version_3_load(tmp_path):
    """The committed version-1 and version-2 profiles load; version 2's message_cpu [a, b] is read as the
    executor's a per message and shared memory's b per byte, so it simulates as it did; saving writes version 3."""
    v1, v2 = (Profile.load(DATA / f"profile_v{v}.json") for v in (1, 2))
    assert v1.runtime is None and v1.codecs == v2.codecs
    raw = json.loads((DATA / "profile_v2.json").read_text())
    assert raw["version"] == 2 and "message_cpu" in raw["runtime"]
    a, b = raw["runtime"]["message_cpu"]
    rt = v2.runtime
    assert (rt.message_cpu_s, rt.copy_cpu, rt.transport, rt.backward_cores) == (a, {"shm": b}, "direct", 0.0)
    assert v2.message_cpu_s(10**6) == pytest.approx(a + b * 10**6)
    again = Profile.load(v2.save(tmp_path / "v3.json"))
    assert json.loads((tmp_path / "v3.json").read_text())["version"] == PROFILE_VERSION == 3
    assert again.runtime == rt
    plan = casync.build_plan([("a", (300_000,))], workers=4, strategy="ring", codec="onebit")
    assert simulate(plan, ONE_NODE, again).iteration_time == simulate(plan, ONE_NODE, v2).iteration_time
    assert np.isfinite(simulate(plan, ONE_NODE, v1).iteration_time)
    newer = v2.to_dict()
    newer["version"] = 2  # version 3's fields under an older version: refused, naming them
    with pytest.raises(ValueError, match="version 3's"):
        Profile.from_dict(newer)
