"""Which buckets' results may be written over the gradient they are computed from (casync.engines.in_place)."""
from __future__ import annotations

import pytest

import casync
from casync.engines.in_place import results_over_gradients

SHAPES = {"w": (301,), "b": (17, 5), "c": (2,)}


@pytest.mark.parametrize("kw", [dict(strategy="ring"), dict(strategy="ps"), dict(strategy="ps", two_way=False),
                                dict(strategy="ps", servers=2)], ids=["ring", "ps", "ps-oneway", "ps-servers"])
@pytest.mark.parametrize("codec", ["none", "onebit", "topk:ratio=0.2"])
def test_ring_and_ps_read_every_partition_before_writing_its_result(kw, codec):
    plan = casync.build_plan(SHAPES, workers=3, codec=codec, partitions=2, bucket_bytes=600, **kw)
    for w in range(3):
        assert results_over_gradients(plan, f"worker:{w}") == {b.name for b in plan.buckets}
    if "servers" in kw:  # a dedicated server writes no results
        assert results_over_gradients(plan, "server:0") == set()


def test_a_writer_that_reads_the_gradient_itself_rules_its_bucket_out():
    """All-gather's output merge adds the local gradient while it writes the result."""
    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, bucket_bytes=600, strategy="allgather")
    assert results_over_gradients(plan, "worker:0") == set()


def test_a_read_that_is_not_before_the_write_rules_its_bucket_out():
    """A plan where an op reading a partition's gradient does not precede its result's writer (here, hand
    edited: a ring's all-gather forward, which runs beside the writer, marked as reading it) keeps a buffer."""
    import networkx as nx

    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, bucket_bytes=600, strategy="ring")
    graph = plan.graph
    mine = [(n, a) for n, a in graph.nodes(data=True) if a["actor"] == "worker:1"]
    w, beside = next((w, n) for writer, w in mine if w.get("output") for n, a in mine
                     if a["bucket"] == w["bucket"] and a["part"] == w["part"] and n != writer
                     and not nx.has_path(graph, n, writer))
    graph.nodes[beside]["local_input"] = True
    assert w["bucket"] not in results_over_gradients(plan, "worker:1")
    assert results_over_gradients(plan, "worker:0") == {b.name for b in plan.buckets}


def test_a_writer_marked_as_reading_the_gradient_rules_its_bucket_out():
    plan = casync.build_plan(SHAPES, workers=3, codec="topk:ratio=0.2", partitions=2, bucket_bytes=600, strategy="ps")
    writer, w = next((n, a) for n, a in plan.graph.nodes(data=True) if a["actor"] == "worker:2" and a.get("output"))
    w["local_input"] = True
    assert w["bucket"] not in results_over_gradients(plan, "worker:2")
