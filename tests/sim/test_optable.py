"""The simulator's op tables: one per assembled plan, or glued from the planner's per-bucket fragments."""
from __future__ import annotations

import random

import pytest

import casync
from casync.plan.assemble import assemble_plan
from casync.plan.tensors import tensor_specs
from casync.planner import Planner, backward_ready_times
from casync.sim.costmodel import ClusterModel, LinearCost, Profile, RuntimeCosts
from casync.sim.optable import OpTable
from casync.sim.simulator import run_table, simulate
from casync.primitives.codecs import get_codec
from tests.helpers import profile_without

CALIBRATED = Profile.default().with_runtime(RuntimeCosts(
    compute_scale=3.0, task_gap_s=0.002, hop=LinearCost(0.004, 1e-10), dispatch_s=0.0005,
    remote_hop=LinearCost(0.006, 2e-10)))


def _planner(model, workers, cluster, profile, ready=None):
    codecs = [get_codec(c) for c in ("none", "fp16", "onebit", "topk:ratio=0.01")]
    return Planner(tensor_specs(model), workers, cluster, profile, strategies=("ring", "ps", "allgather"),
                   codecs=codecs, partitions="auto", bucket_bytes=1 << 20, ready_times=ready, two_way=True,
                   error_feedback=True)


@pytest.mark.parametrize("cluster,profile,backward_s", [
    (ClusterModel.for_workers(4, bandwidth_gbps=10), Profile.default(), 0.0),
    (ClusterModel(nodes=2, workers_per_node=2, bandwidth_gbps=1, cores_per_node=2), CALIBRATED, 0.02),
    (ClusterModel(nodes=4, workers_per_node=1, bandwidth_gbps=1, host_cores=2, compute_lanes=2), CALIBRATED, 0.0),
])
def test_fragment_tables_simulate_exactly_like_the_assembled_plan(cluster, profile, backward_s):
    """What the planner simulates (per-bucket fragments, glued) is what simulate() gives on the plan it returns:
    the same op records, times, critical path and link bytes, for mixed strategies, codecs and partitions."""
    ready = backward_ready_times("resnet50", backward_s) if backward_s else None
    planner = _planner("resnet50", 4, cluster, profile, ready)
    rng = random.Random(7)
    for _ in range(4):
        assign = [rng.randrange(len(b.options)) for b in planner.buckets]
        plan = assemble_plan(planner.specs, 4, planner.groups, planner.choices(assign, [""] * len(assign)))
        expected = simulate(plan, cluster, profile, ready)
        got = run_table(planner.table(assign, compact=False), cluster, profile,
                        {b.name: b.ready for b in planner.buckets})
        assert got.iteration_time == expected.iteration_time
        assert got.records == expected.records
        assert got.critical_path == expected.critical_path
        assert got.bytes_per_link == expected.bytes_per_link and got.lanes == expected.lanes
        fast = run_table(planner.table(assign, compact=False), cluster, profile,
                         {b.name: b.ready for b in planner.buckets}, records=False)
        assert fast.iteration_time == expected.iteration_time and fast.records == []
        if planner.exact_compact(assign):  # what the planner simulates where it can: the templates, as exact
            compact = run_table(planner.table(assign), cluster, profile, {b.name: b.ready for b in planner.buckets},
                                records=False)
            assert compact.iteration_time == pytest.approx(expected.iteration_time, rel=1e-9)
    # a fragment is built once per (bucket size, option), however many buckets and candidates use it
    sizes = {(b.numel, b.options[j].strategy, str(b.options[j].codec), b.options[j].partitions)
             for b in planner.buckets for j in range(len(b.options))}
    assert len([k for k in planner._tables if not k[-1]]) <= len(sizes)


def test_planner_reports_what_simulate_gives_on_its_plan():
    cl = ClusterModel.for_workers(8, bandwidth_gbps=10)
    plan = casync.build_plan("bert-base", workers=8, strategy="auto", codec="auto", partitions="auto", cluster=cl)
    info = plan.options["planner"]
    assert info["simulated_s"] == simulate(plan, cl).iteration_time
    assert info["candidates"][0]["simulated_s"] <= info["simulated_s"] + 1e-12
    assert [c["simulated_s"] for c in info["candidates"]] == sorted(c["simulated_s"] for c in info["candidates"])
    assert info["simulations"] >= len(info["candidates"]) >= 1  # refining runs are not candidates


def test_table_rows_follow_the_graph():
    plan = casync.build_plan("tiny", workers=3, strategy="ps", codec="onebit")
    table = OpTable.from_graph(plan.graph)
    assert table.names == list(plan.graph)
    assert sorted(table.rank) == list(range(len(table)))
    assert [table.names[i] for i in sorted(range(len(table)), key=table.rank.__getitem__)] == sorted(plan.graph)
    for i, name in enumerate(table.names):
        assert {table.names[s] for s in table.succ[i]} == set(plan.graph.successors(name))
        assert table.npred[i] == plan.graph.in_degree(name)
        assert table.actors[table.actor[i]] == plan.graph.nodes[name]["actor"]


def test_concat_refuses_shared_priorities_and_multi_bucket_fragments():
    plan = casync.build_plan("tiny", workers=2, strategy="ring", codec="none", bucket_bytes=0)
    whole = OpTable.from_graph(plan.graph)
    assert len(whole.buckets) > 1
    single = OpTable.from_graph(casync.build_plan({"x": (100,)}, workers=2, strategy="ring").graph)
    with pytest.raises(ValueError, match="distinct priority"):
        OpTable.concat([(single, "a", 0), (single, "b", 0)])
    with pytest.raises(ValueError, match="one bucket"):
        OpTable.concat([(whole, "a", 0)])


def test_unknown_ops_are_named():
    plan = casync.build_plan("tiny", workers=2, strategy="ring", codec="none")
    node = next(iter(plan.graph))
    plan.graph.nodes[node]["op"] = "teleport"
    with pytest.raises(ValueError, match="teleport"):
        OpTable.from_graph(plan.graph)


@pytest.mark.parametrize("enabled", [True, False])
def test_planning_leaves_garbage_collection_as_it_found_it(enabled):
    """The planner pauses the cyclic collector while it works, and restores it, even when planning fails."""
    import gc

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        casync.build_plan("tiny", workers=2, strategy="auto", codec="auto")
        assert gc.isenabled() is enabled
        with pytest.raises(ValueError, match="ready_times"):
            casync.build_plan("tiny", workers=2, strategy="auto", codec="auto", ready_times={"nope": 1.0})
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_simulator_names_broken_graphs():
    """Hand-edited plans: a cycle, or a send that does not feed exactly one recv, is a clear error, not a hang."""
    plan = casync.build_plan("tiny", workers=2, strategy="ring", codec="none", partitions=1)
    send = next(n for n, op in plan.graph.nodes(data="op") if op == "send")
    recv = next(iter(plan.graph.successors(send)))
    plan.graph.add_edge(send, next(n for n, op in plan.graph.nodes(data="op") if op == "decode" and n != recv))
    with pytest.raises(ValueError, match=f"{send}.*exactly one recv"):
        simulate(plan)
    plan = casync.build_plan("tiny", workers=2, strategy="ring", codec="none", partitions=1)
    first, last = next(iter(plan.graph)), list(plan.graph)[-1]
    plan.graph.add_edge(last, first)
    with pytest.raises(ValueError, match="cycle"):
        simulate(plan)


@pytest.mark.parametrize("strategy,kw,sparse_inputs,local", [("ps", {}, 3, 1), ("allgather", {}, 4, 0),
                                                                ("ring", {}, 1, 1), ("ps", {"servers": 2}, 4, 0)])
def test_a_sparsifiers_decode_into_a_merge_is_priced_as_its_entries(strategy, kw, sparse_inputs, local):
    """As the per-rank executor runs it (casync.primitives.merge.Sparse): a topk decode whose only reader is a merge
    costs its entries, the merge only its dense inputs (one pass at least, one fewer where an encode computes
    it: see the next test); output decodes stay whole."""
    from casync.sim.optable import DECODE, MERGE, folded_merge

    plan = casync.build_plan({"w": (4000,)}, workers=4, strategy=strategy, codec="topk:ratio=0.1", **kw)
    dense = casync.build_plan({"w": (4000,)}, workers=4, strategy=strategy, codec="onebit", **kw)
    table, plain = OpTable.from_graph(plan.graph), OpTable.from_graph(dense.graph)
    graph = plan.graph
    for i, name in enumerate(table.names):
        a = graph.nodes[name]
        if table.kind[i] == DECODE:
            assert table.cost[i][2] == (False if a.get("output") else "entries"), name
        if table.kind[i] == MERGE:  # every case here merges sparse inputs
            charged = max(1, local) - folded_merge(graph, name, a)
            assert table.cost[i][2] is False and table.cost[i][3] == (charged, charged), name
    # onebit decodes in blocks: the same decodes are deferred, and its merges count them as dense inputs too
    assert all(c[2] == (False if dense.graph.nodes[n].get("output") else "deferred")
               for n, k, c in zip(plain.names, plain.kind, plain.cost) if k == DECODE)
    assert max(c[3][0] + folded_merge(dense.graph, n, dense.graph.nodes[n])
               for n, k, c in zip(plain.names, plain.kind, plain.cost) if k == MERGE) == sparse_inputs + local
    profile = Profile.default()
    durations = table.durations(profile)
    for i, key in enumerate(table.cost):
        if table.kind[i] == DECODE:
            price = profile.entries_s if key[2] == "entries" else profile.decode_s
            assert durations[i] == price(key[0], key[1])


@pytest.mark.parametrize("strategy,kw,codec,folded", [
    ("ring", {}, "onebit", True), ("ring", {}, "randomk:ratio=0.1", True),
    ("ps", {"two_way": True}, "topk:ratio=0.1", True), ("ps", {"two_way": True}, "fp16", True),
    ("ps", {"two_way": False}, "onebit", False), ("allgather", {}, "onebit", False), ("ring", {}, "none", False),
    ("ring", {"error_feedback": False}, "onebit", False), ("ring", {}, "terngrad", False)])
def test_a_merge_an_encode_computes_is_charged_one_pass_fewer(strategy, kw, codec, folded):
    """The executor hands a merge to the error-feedback encode that alone reads it
    (casync.primitives.merge.PendingMerge) where the codec computes it as it adds its residual: the simulator
    charges such a merge one input fewer, and only those. ps one-way's pull and codec none have no error feedback;
    allgather's merges are outputs; terngrad's error feedback is its contractive encode, which takes whole inputs."""
    from casync.sim.optable import MERGE, folded_merge, handed_decodes, merged_inputs
    from casync.primitives.merge import handed_to_encode

    plan = casync.build_plan({"w": (4000,)}, workers=4, strategy=strategy, codec=codec, **kw)
    graph, table, handed = plan.graph, OpTable.from_graph(plan.graph), handed_decodes(plan.graph)
    merges = [i for i, k in enumerate(table.kind) if k == MERGE]
    assert merges
    for i in merges:
        name = table.names[i]
        a = graph.nodes[name]
        readers = [graph.nodes[v] for v in graph.successors(name)]
        assert folded_merge(graph, name, a) is folded, name
        assert handed_to_encode(a, readers) is (folded or codec == "terngrad"), name
        sparse = sum(1 for u in graph._pred[name] if handed.get(u) == "entries")
        whole = merged_inputs(len(graph._pred[name]) - sparse + bool(a.get("local_input")), sparse)
        assert table.cost[i][3][0] == (whole - 1 if folded else whole), name


def test_a_profile_without_entries_prices_them_as_decodes():
    """Profiles written before the entries cost existed keep their prices."""
    profile = Profile.default()
    older = profile_without(profile, "entries")
    assert older.entries_s("topk(ratio=0.01)", 10**6) == older.decode_s("topk(ratio=0.01)", 10**6)
    assert profile.entries_s("topk(ratio=0.01)", 10**6) < profile.decode_s("topk(ratio=0.01)", 10**6)


@pytest.mark.parametrize("strategy,kw", [("allgather", {}), ("ps", {"two_way": True}), ("ps", {"servers": 2}),
                                         ("ring", {})])
def test_a_block_decoders_decode_into_a_merge_is_priced_deferred_where_the_profile_has_it(strategy, kw):
    """As the per-rank executor runs it (casync.primitives.merge.Deferred, through onebit's one-pass merge): a onebit
    decode whose only reader is a merge costs the profile's ``deferred``, the merge one accumulator pass plus
    its dense inputs (one fewer where an encode computes it); a profile without ``deferred`` keeps the old
    prices (a whole decode, and the merge charging it as a dense input). Output decodes stay whole."""
    from casync.sim.optable import DECODE, MERGE, folded_merge

    plan = casync.build_plan({"w": (4000,)}, workers=4, strategy=strategy, codec="onebit", **kw)
    graph, table = plan.graph, OpTable.from_graph(plan.graph)
    profile = Profile.default()
    older = profile_without(profile, "deferred")
    assert profile.prices_deferred("onebit") and not older.prices_deferred("onebit")
    new, old = table.durations(profile), table.durations(older)
    index = {name: i for i, name in enumerate(table.names)}
    merges = 0
    for i, name in enumerate(table.names):
        if table.kind[i] not in (DECODE, MERGE):
            continue
        a, (codec, n, mode, _) = graph.nodes[name], table.cost[i]
        if table.kind[i] == DECODE:
            assert mode == (False if a.get("output") else "deferred"), name
            assert old[i] == profile.decode_s("onebit", n)
            assert new[i] == (profile.decode_s if a.get("output") else profile.deferred_s)("onebit", n)
        if table.kind[i] == MERGE:
            merges += 1
            deferred = sum(1 for u in graph._pred[name] if table.cost[index[u]][2] == "deferred")
            dense = len(graph._pred[name]) - deferred + bool(a.get("local_input"))
            fold = folded_merge(graph, name, a)
            assert deferred and codec == "onebit" and mode is True, name
            assert new[i] == profile.merge_s(n, max(1, dense) - fold), name
            assert old[i] == profile.merge_s(n, dense + deferred - fold), name
    assert merges


def test_calibration_prices_ops_as_the_simulator_does():
    """casync.runtime.calibrate fits measured over predicted op time: predicted the simulator's way."""
    from casync.runtime.calibrate import _predicted_op_s
    from casync.sim.optable import KINDS, cost_key, handed_decodes, op_seconds

    plan = casync.build_plan({"w": (4000,), "b": (10,)}, workers=3, strategy="ps", codec="randomk:ratio=0.1")
    graph, profile = plan.graph, Profile.default()
    handed = handed_decodes(graph)
    assert handed and all(graph.nodes[n]["op"] == "decode" and not graph.nodes[n]["output"] for n in handed)
    for n, a in graph.nodes(data=True):
        if a["op"] in ("encode", "decode", "merge"):
            want = op_seconds(profile, KINDS.index(a["op"]), cost_key(graph, n, a, a["numel"], handed), False)
            assert _predicted_op_s(graph, n, profile, handed) == want


@pytest.mark.parametrize("strategy,kw", [("ring", {}), ("ps", {"two_way": True}), ("allgather", {})])
def test_calibration_counts_a_merge_its_encode_computes_with_that_encode(strategy, kw):
    """The encode's record carries a folded merge's work, so calibration adds the merge's measured and profiled
    seconds to the encode's kind: the merge scale is fitted on merges that ran as merges only."""
    from casync.runtime.calibrate import _add_op_time, _predicted_op_s
    from casync.sim.optable import folded_merge, handed_decodes

    plan = casync.build_plan({"w": (4000,), "b": (10,)}, workers=3, strategy=strategy, codec="onebit", **kw)
    graph, profile = plan.graph, Profile.default()
    handed = handed_decodes(graph)
    totals: dict[str, list[float]] = {}
    expected: dict[str, list[float]] = {}
    for n, a in graph.nodes(data=True):
        if a["op"] not in ("encode", "decode", "merge"):
            continue
        _add_op_time(totals, {"op": a["op"], "node": n, "cpu": 1e-3, "start": 0.0, "end": 1.0}, graph, profile, handed)
        folded = a["op"] == "merge" and folded_merge(graph, n, a)
        # a merge adding onebit's deferred decodes itself, and those decodes (their work is done in the merge),
        # are scaled as onebit's merges (merge:onebit)
        key = "encode:onebit" if folded or a["op"] == "encode" else (
            "merge:onebit" if a["op"] == "merge" or n in handed else "decode:onebit")
        got = expected.setdefault(key, [0.0, 0.0])
        got[0] += 1e-3
        got[1] += _predicted_op_s(graph, n, profile, handed)
    assert totals.keys() == expected.keys() and ("merge:onebit" in totals or strategy != "allgather")
    for key, (measured, predicted) in expected.items():
        assert totals[key][0] == pytest.approx(measured) and totals[key][1] == pytest.approx(predicted), key
