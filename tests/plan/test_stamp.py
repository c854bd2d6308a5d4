"""Stamped plans are the graphs the builder makes, node for node: ids, attributes, order, edges and slots."""
from __future__ import annotations

import gc
import time

import networkx as nx
import pytest

import casync
from casync.plan.assemble import BucketChoice, assemble_plan, make_buckets, name_buckets
from casync.plan.specs import TensorSpec, split_even
from casync.primitives import feedback
from casync.primitives.codecs import get_codec
from casync.strategies import GraphBuilder, Strategy, Unit, get_strategy, register_strategy, unregister_strategy

#: several buckets of one structure and different sizes, plus one of another structure
SPECS = [TensorSpec("a", (100_003,)), TensorSpec("blk.weight", (70_001,)), TensorSpec("c/d", (250_000,)),
         TensorSpec("e", (9,))]


def built_directly(specs, workers, groups, choices, error_feedback="auto", compact=False):
    """The reference: every bucket expanded by its strategy into one GraphBuilder, as before stamping."""
    builder = GraphBuilder(nx.DiGraph())
    for index, ((name, group), c) in enumerate(zip(groups, choices)):
        plan = assemble_plan(specs, workers, groups, choices, error_feedback=error_feedback, compact=compact)
        bucket = plan.buckets[index]
        unit = Unit(bucket=name, partitions=tuple(bucket.partitions), workers=workers, codec=c.codec,
                    error_feedback=feedback.resolve(c.codec, error_feedback), divisor=workers, priority=bucket.priority,
                    servers=bucket.servers, two_way=c.two_way)
        strategy = get_strategy(c.strategy)
        (strategy.expand_compact if compact else strategy.expand)(builder, unit)
    return builder.graph


def same_graph(got: nx.DiGraph, want: nx.DiGraph) -> None:
    assert list(got.nodes) == list(want.nodes)  # same order: the simulator's op table follows it
    for n in want:
        assert got.nodes[n] == want.nodes[n], n
        assert dict(got._succ[n]) == dict(want._succ[n]) and dict(got._pred[n]) == dict(want._pred[n]), n
        for v in got._succ[n]:
            assert got._succ[n][v] is got._pred[v][n]  # one data dict per edge, as add_edge stores it
    assert list(got.edges(data=True)) == list(want.edges(data=True))


@pytest.mark.parametrize("strategy,kw,codec", [
    ("ring", {}, "onebit"), ("ring", {}, "none"), ("ps", {}, "topk:ratio=0.01"), ("ps", {"two_way": False}, "terngrad"),
    ("ps", {"servers": 2}, "onebit"), ("allgather", {}, "fp16"), ("allgather", {"partitions": 3}, "randomk")])
@pytest.mark.parametrize("ef", ["auto", False])
def test_stamped_plan_is_the_builders_graph(strategy, kw, codec, ef):
    groups = name_buckets(SPECS, make_buckets(SPECS, 0))
    choices = [BucketChoice(strategy, get_codec(codec), partitions=kw.get("partitions", 4 if strategy != "allgather"
                                                                            else None),
                            two_way=kw.get("two_way", True), servers=kw.get("servers"))] * 3
    choices.append(BucketChoice("ring", get_codec("none")))
    plan = assemble_plan(SPECS, 5, groups, choices, error_feedback=ef)
    same_graph(plan.graph, built_directly(SPECS, 5, groups, choices, ef))
    assert nx.is_directed_acyclic_graph(plan.graph)
    loaded = casync.SyncPlan.from_dict(plan.to_dict())  # io and the full lint accept it
    assert loaded == plan


def test_stamped_compact_plan_is_the_builders_graph():
    groups = name_buckets(SPECS[:3], make_buckets(SPECS[:3], 0))
    choices = [BucketChoice("ps", get_codec("onebit"), partitions=8)] * 3
    plan = assemble_plan(SPECS[:3], 8, groups, choices, compact=True)
    same_graph(plan.graph, built_directly(SPECS[:3], 8, groups, choices, compact=True))


class OddSizes(Strategy):
    """A strategy whose nodes carry sizes of their own making: its template must not be resized."""

    name = "odd-sizes"
    in_auto = False

    def expand(self, g, unit):
        for part in range(len(unit.partitions)):
            for w in range(unit.workers):
                enc = g.encode(unit, part, f"worker:{w}", src=None, tag="x")
                g.graph.nodes[enc]["nbytes"] = 7  # not 4 * numel
                g.merge(unit, part, f"worker:{w}", [g.decode(unit, part, f"worker:{w}", enc, codec_of=enc)],
                        local_slot=None, output=True)

    def op_count(self, workers, parts, servers=None):
        return 3 * workers * parts


def test_a_template_with_its_own_sizes_is_rebuilt_per_size():
    register_strategy(OddSizes())
    try:
        specs = [TensorSpec("a", (1000,)), TensorSpec("b", (1000,)), TensorSpec("c", (999,))]
        groups = name_buckets(specs, make_buckets(specs, 0))
        choices = [BucketChoice("odd-sizes", get_codec("none"), partitions=2)] * 3
        plan = assemble_plan(specs, 2, groups, choices, error_feedback=False)
        same_graph(plan.graph, built_directly(specs, 2, groups, choices, False))
        assert [a["numel"] for n, a in plan.graph.nodes(data=True) if n.startswith("c/p1/")][0] == \
            split_even(999, 2)[1][1] - split_even(999, 2)[1][0]
    finally:
        unregister_strategy("odd-sizes")


def test_large_plans_assemble_quickly():
    """BERT-base at 16 workers (29k ops, one structure for 15 buckets): well under the old 0.4 s."""
    casync.build_plan("tiny", workers=2)
    gc.collect()
    start = time.perf_counter()
    plan = casync.build_plan("bert-base", workers=16, strategy="ring", codec="onebit")
    elapsed = time.perf_counter() - start
    assert plan.graph.number_of_nodes() == 29_280
    assert elapsed < 1.0, elapsed  # about 0.1 s on the 2-core development machine; generous for noise


class LocalOnly(Strategy):
    """Every worker keeps its own gradient (a merge of the local input alone): a sub-graph without edges."""

    name = "local-only"
    in_auto = False

    def expand(self, g, unit):
        for part in range(len(unit.partitions)):
            for w in range(unit.workers):
                g.merge(unit, part, f"worker:{w}", [], local_slot=0, divisor=unit.divisor, output=True)

    def op_count(self, workers, parts, servers=None):
        return workers * parts


def test_a_template_without_edges_is_stamped_as_built():
    register_strategy(LocalOnly())
    try:
        groups = name_buckets(SPECS[:3], make_buckets(SPECS[:3], 0))
        choices = [BucketChoice("local-only", get_codec("none"), partitions=2)] * 3
        plan = assemble_plan(SPECS[:3], 3, groups, choices)
        same_graph(plan.graph, built_directly(SPECS[:3], 3, groups, choices))
        assert plan.graph.number_of_edges() == 0 and plan.graph.number_of_nodes() == 3 * 3 * 2
    finally:
        unregister_strategy("local-only")


def test_builder_add_refuses_attributes_it_sets_itself():
    unit = Unit(bucket="b", partitions=((0, 4),), workers=1, codec=get_codec("none"), error_feedback=False,
                divisor=1, priority=0)
    g = GraphBuilder()
    with pytest.raises(TypeError, match="numel"):
        g.add(unit, 0, "worker:0", "merge", numel=3)
    node = g.add(unit, 0, "worker:0", "merge", nbytes=16, local_input=True, local_slot=0, divisor=1, output=True)
    assert list(g.graph.nodes[node]) == ["op", "actor", "bucket", "part", "numel", "priority", "nbytes",
                                         "local_input", "local_slot", "divisor", "output"]
