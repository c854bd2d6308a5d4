"""Plan structure: op counts per strategy, node attributes, bucketing, inputs, summary and pictures."""
from __future__ import annotations

import networkx as nx
import pytest
import torch

import casync
from casync.primitives.ir import OPS


def expected_counts(strategy: str, n: int, k: int, servers: int | None = None) -> dict[str, int]:
    """The documented number of each primitive for one tensor with N workers and K partitions."""
    if strategy == "ring":
        per = dict(encode=n, decode=2 * n - 1, merge=n - 1, send=2 * (n - 1)) if n > 1 else \
            dict(encode=1, decode=1, merge=1, send=0)
    elif strategy == "allgather":
        per = dict(encode=n, decode=n * n, merge=n, send=n * (n - 1))
    elif servers:
        per = dict(encode=n + 1, decode=2 * n, merge=1, send=2 * n)
    else:
        per = dict(encode=n, decode=2 * n - 1, merge=1, send=2 * (n - 1))
    counts = {op: k * c for op, c in per.items()}
    counts["recv"] = counts["send"]
    return counts


@pytest.mark.parametrize("strategy,servers", [("ring", None), ("allgather", None), ("ps", None), ("ps", 3)])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_op_counts_match_documented_formulas(strategy, servers, n, k):
    plan = casync.build_plan({"t": (1000,)}, workers=n, strategy=strategy, codec="onebit", partitions=k,
                             servers=servers)
    assert plan.op_counts("t") == expected_counts(strategy, n, k, servers)


@pytest.mark.parametrize("strategy,servers", [("ring", None), ("allgather", None), ("ps", None), ("ps", 2)])
def test_node_attributes_and_send_recv_pairs(strategy, servers):
    plan = casync.build_plan({"t": (100,), "u": (3, 3)}, workers=3, strategy=strategy, codec="topk:ratio=0.1",
                             servers=servers, bucket_bytes=0)
    g = plan.graph
    assert nx.is_directed_acyclic_graph(g)
    for node, a in g.nodes(data=True):
        assert a["op"] in OPS
        assert set(a) >= {"op", "actor", "bucket", "part", "nbytes"}
        assert a["actor"].split(":")[0] in ("worker", "server")
        if a["op"] == "send":
            (recv,) = list(g.successors(node))
            r = g.nodes[recv]
            assert r["op"] == "recv" and r["actor"] == a["peer"] and r["peer"] == a["actor"]
            assert r["nbytes"] == a["nbytes"] == plan.codecs[a["codec"]].compressed_nbytes(a["numel"])
        for pred in g.predecessors(node):  # data crosses actors only through send -> recv
            if g.nodes[pred]["actor"] != a["actor"]:
                assert g.nodes[pred]["op"] == "send" and a["op"] == "recv"
    # every worker has exactly one output per (tensor, partition)
    for b in plan.buckets:
        for w in range(3):
            outs = [n for n in plan.nodes(bucket=b.name, actor=f"worker:{w}") if g.nodes[n].get("output")]
            assert sorted(g.nodes[n]["part"] for n in outs) == list(range(len(b.partitions)))


def test_ring_wire_bytes_follow_codec_size():
    n, size = 4, 4000
    plan = casync.build_plan({"t": (size,)}, workers=n, strategy="ring", codec="none")
    assert plan.wire_bytes() == 2 * (n - 1) * 4 * size  # 2(N-1)/N of the tensor per worker, N workers
    onebit = casync.build_plan({"t": (size,)}, workers=n, strategy="ring", codec="onebit")
    assert onebit.wire_bytes() < plan.wire_bytes() / 20


def test_bucketing_fuses_small_tensors_in_backward_order():
    shapes = [(f"t{i}", (100,)) for i in range(10)] + [("big", (10_000,))]
    plan = casync.build_plan(shapes, workers=2, bucket_bytes=1000)
    # pairs of 400 B fill 1000 B buckets; the last pending pair rides along with the large tensor
    assert [b.tensor_names for b in plan.buckets] == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"], ["t6", "t7"],
                                                     ["t8", "t9", "big"]]
    assert [b.priority for b in plan.buckets] == [4, 3, 2, 1, 0]  # the next forward needs the last bucket first
    assert plan.bucket("bucket4").members[2].offset == 200 and plan.bucket("bucket4").numel == 10_200
    unfused = casync.build_plan(shapes, workers=2, bucket_bytes=0)
    assert len(unfused.buckets) == 11


@pytest.mark.parametrize("choice", [dict(strategy="ps", codec="onebit"),
                                    dict(strategy="auto", codec=["none", "onebit"], cluster=casync.ClusterModel(nodes=2))])
def test_given_buckets_are_kept_fixed_or_planned(choice):
    """``buckets=`` (a DDP job's own): each list one bucket, in that order and member order, whatever
    ``bucket_bytes`` says; the planner then chooses per given bucket."""
    shapes = [(f"t{i}", (100,)) for i in range(5)] + [("big", (10_000,))]
    given = [["t1", "t0"], ["big"], ["t2", "t3", "t4"]]
    plan = casync.build_plan(shapes, workers=2, bucket_bytes=1000, buckets=given, **choice)
    assert [b.tensor_names for b in plan.buckets] == given
    assert plan.options["buckets"] == "given" and plan.options["bucket_bytes"] is None
    assert plan.bucket("big").numel == 10_000 and plan.bucket("bucket2").members[2].offset == 200
    again = casync.SyncPlan.from_dict(plan.to_dict())
    assert [b.tensor_names for b in again.buckets] == given


@pytest.mark.parametrize("buckets,exc,match", [
    ([["t0"], ["t1"]], ValueError, r"in no bucket: \['big'\]"),
    ([["t0", "t1", "big"], ["t1"]], ValueError, r"in two buckets: \['t1'\]"),
    ([["t0", "t1", "big", "nope"]], ValueError, r"unknown tensors: \['nope'\]"),
    ([["t0", "t1", "big"], []], ValueError, r"empty buckets: \[1\]"),
    ("t0,t1,big", TypeError, "list of lists of tensor names"),
])
@pytest.mark.parametrize("strategy", ["ring", "auto"])
def test_bad_given_buckets_name_what_is_wrong(buckets, exc, match, strategy):
    with pytest.raises(exc, match=match):
        casync.build_plan([("t0", (4,)), ("t1", (4,)), ("big", (9,))], workers=2, strategy=strategy, buckets=buckets)


def test_partitions_clamped_to_tensor_size():
    plan = casync.build_plan({"one": (1,), "scalar": (), "empty": (0,)}, workers=8, strategy="ring", bucket_bytes=0)
    assert [len(b.partitions) for b in plan.buckets] == [1, 1, 1]
    assert plan.bucket("empty").partitions == [(0, 0)]


def test_torch_module_parameters_in_backward_order():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    model[0].bias.requires_grad_(False)
    plan = casync.build_plan(model, workers=2)
    assert [t.name for t in plan.tensors] == ["1.bias", "1.weight", "0.weight"]
    assert plan.tensors[1].shape == (2, 8) and plan.tensors[1].dtype == "float32"


@pytest.mark.parametrize("name,params,count", [("resnet50", 25_557_032, 161), ("vgg16", 138_357_544, 32),
                                               ("bert-base", 109_482_240, None), ("gpt2", 124_439_808, None)])
def test_builtin_models_build_plans(name, params, count):
    plan = casync.build_plan(name, workers=4, strategy="ring", codec="onebit")
    assert sum(t.numel for t in plan.tensors) == params
    if count:
        assert len(plan.tensors) == count
    assert "TOTAL" in plan.summary()


def test_summary_has_a_row_per_bucket():
    plan = casync.build_plan("resnet50", workers=8, strategy="ring", codec="onebit")
    text = plan.summary()
    lines = text.splitlines()
    assert len(lines) == 1 + 2 + len(plan.buckets) + 1
    assert "onebit+ef" in text and "ring" in text


def test_dot_and_png(tmp_path):
    plan = casync.build_plan({"a": (100,), "b": (50,)}, workers=3, strategy="ps", servers=1, bucket_bytes=0)
    dot = plan.to_dot()
    assert dot.startswith("digraph") and dot.count("->") == plan.graph.number_of_edges()
    assert "cluster" in dot and '"server:0"' in dot
    png = plan.draw(str(tmp_path / "plan.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "send" in plan.table("a") and "worker:2" in plan.table()


BAD_OPTIONS = [
    (dict(workers=0), ValueError, "workers"),
    (dict(workers=2.5), TypeError, "workers"),
    (dict(strategy="butterfly"), ValueError, "butterfly"),
    (dict(codec="zip"), ValueError, "zip"),
    (dict(codec="topk:ratio=1.5"), ValueError, "ratio"),
    (dict(codec="topk:ratio=0"), ValueError, "ratio"),
    (dict(partitions=0), ValueError, "partitions"),
    (dict(partitions=10**9), ValueError, "partitions"),
    (dict(servers=2), ValueError, "servers"),
    (dict(strategy="ps", servers=0), ValueError, "servers"),
    (dict(op="max"), ValueError, "op"),
    (dict(bucket_bytes=-1), ValueError, "bucket_bytes"),
    (dict(two_way="yes"), TypeError, "two_way"),
]


@pytest.mark.parametrize("options,exc,match", BAD_OPTIONS)
def test_bad_options_raise_clear_errors(options, exc, match):
    with pytest.raises(exc, match=match):
        casync.build_plan({"a": (10,)}, **options)


@pytest.mark.parametrize("tensors,exc,match", [
    ({}, ValueError, "no tensors"),
    ({"a": (2, -1)}, ValueError, "'a'.*negative"),
    ({"a": "big"}, TypeError, "'a'"),
    ([("a", (2,)), ("a", (3,))], ValueError, "'a'.*twice"),
    ("resnet51", ValueError, "resnet51"),
    (42, TypeError, "tensors"),
    (torch.nn.ReLU(), ValueError, "no tensors"),
])
def test_bad_tensor_inputs(tensors, exc, match):
    with pytest.raises(exc, match=match):
        casync.build_plan(tensors)


def test_table_of_a_tensor_fused_into_a_bucket_shows_that_bucket():
    """README: ``plan.table("fc.weight")`` prints every op of the bucket fc.weight went into (was: empty)."""
    plan = casync.build_plan("resnet50", workers=2, strategy="ring", codec="onebit")
    bucket = plan.bucket_of("fc.weight").name
    assert bucket != "fc.weight"
    assert plan.table("fc.weight") == plan.table(bucket)
    assert len(plan.table("fc.weight").splitlines()) == 2 + sum(1 for _ in plan.nodes(bucket=bucket))
    with pytest.raises(KeyError, match="nosuch"):
        plan.table("nosuch")
