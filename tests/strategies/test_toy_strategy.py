"""A strategy written in a test, registered with one call, goes everywhere a built-in one goes.

``toy-root``: every worker encodes its partition and sends it to worker 0, which decodes them all, sums in
rank order, encodes the result once and sends those bytes back to everyone (a direct reduce-then-broadcast).
It has no analytical estimate, so the planner simulates it; no compact template, so templates refuse it.
"""
from __future__ import annotations

import pytest

import casync
from casync.primitives.ir import worker
from casync.strategies import Strategy, get_strategy, register_strategy, unregister_strategy
from tests.engines.conformance import ENGINES, SHAPES, check_conformance

USES_RAY_LOCAL = True  # the Ray engines' cells ask for the shared embedded Ray (tests/conftest.py)


class RootReduce(Strategy):
    name = "toy-root"
    summary = "reduce every partition at worker 0, broadcast the encoded sum"
    costs = {"encode": "K·(N+1)", "decode": "K·2N", "merge": "K", "send": "K·2(N−1)"}
    in_auto = False  # only when asked for: strategy=[..., "toy-root"]

    def expand(self, g, unit):
        n, root = unit.workers, worker(0)
        for part in range(len(unit.partitions)):
            decoded = []
            for w in range(n):
                enc = g.encode(unit, part, worker(w), src=None, ef_role=worker(w), tag="up")
                payload = enc if w == 0 else g.transfer(unit, part, enc, worker(w), root, codec_of=enc, stage="up")
                decoded.append(g.decode(unit, part, root, payload, codec_of=enc, tag=f"from{w}"))
            total = g.merge(unit, part, root, decoded, local_slot=None, divisor=unit.divisor, tag="sum")
            final = g.encode(unit, part, root, src=total, ef_role="root", tag="down")
            g.decode(unit, part, root, final, codec_of=final, output=True, tag="down")
            for w in range(1, n):
                recv = g.transfer(unit, part, final, root, worker(w), codec_of=final, stage="down")
                g.decode(unit, part, worker(w), recv, codec_of=final, output=True, tag="down")

    def op_count(self, workers, parts, servers=None):
        return parts * (7 * workers - 2)


@pytest.fixture(scope="module")
def toy():
    strategy = register_strategy(RootReduce())  # the one call
    yield strategy
    unregister_strategy(strategy.name)


def test_build_plan_summary_and_op_count(toy):
    plan = casync.build_plan(SHAPES, workers=4, strategy="toy-root", codec="onebit", partitions=2)
    assert plan.graph.number_of_nodes() == sum(toy.op_count(4, len(b.partitions)) for b in plan.buckets)
    assert "toy-root" in plan.summary()
    assert get_strategy("toy-root") is toy


def test_simulate_and_compact_refusal(toy):
    plan = casync.build_plan("resnet50", workers=4, strategy="toy-root", codec="onebit")
    timeline = casync.simulate(plan, casync.ClusterModel(nodes=4, workers_per_node=1, bandwidth_gbps=10))
    assert timeline.iteration_time > 0 and set(timeline.bytes_per_link) >= {("worker:1", "worker:0")}
    from casync.plan.assemble import BucketChoice, assemble_plan
    from casync.plan.tensors import tensor_specs

    specs = tensor_specs({"w": (100,)})
    with pytest.raises(ValueError, match="toy-root.*no compact template"):
        assemble_plan(specs, 8, [("w", specs)], [BucketChoice("toy-root", casync.get_codec("onebit"))], compact=True)


def test_planner_searches_it_when_asked(toy):
    cluster = casync.ClusterModel(nodes=4, workers_per_node=1, bandwidth_gbps=1)
    plan = casync.build_plan("resnet50", workers=4, strategy=["ring", "toy-root"], codec=["none", "onebit"],
                             cluster=cluster)
    info = plan.options["planner"]
    assert info["strategies"] == ["ring", "toy-root"]
    assert any("toy-root" in c["plan"] for c in info["candidates"])  # the fixed toy plan was simulated
    simulated = {c["plan"]: c["simulated_s"] for c in info["candidates"]}
    assert info["simulated_s"] <= min(simulated.values())


def test_auto_leaves_it_out_unless_asked(toy):
    plan = casync.build_plan({"w": (100_000,)}, workers=2, strategy="auto", codec="none")
    assert "toy-root" not in plan.options["planner"]["strategies"]


#: engines run by the lossy codec alone (error feedback, with the root's own residual): RayEngine over gloo or the
#: object store runs the same plan as over its shared-memory default ("ray-direct", which runs both codecs) and
#: moves whatever an op returns without looking at the codec (tests/engines/test_conformance.py, VARIANT_CELLS);
#: that the toy plan's lossless sums are exact means is LocalEngine's cell, every engine giving its bits
LOSSY_ONLY = ("ray-gloo", "ray-objectstore")
CELLS = [pytest.param(name, codec, marks=[pytest.mark.ray] if needs_ray else [], id=f"{codec}-{name}")
         for codec in ("none", "topk:ratio=0.1") for name, (_, needs_ray) in ENGINES.items()
         if codec != "none" or name not in LOSSY_ONLY]


@pytest.mark.parametrize("engine,codec", CELLS)
def test_every_engine_runs_it_bit_identically(toy, engine, codec, request):
    if ENGINES[engine][1]:
        request.getfixturevalue("ray_local")
    plan = casync.build_plan(SHAPES, workers=3, strategy="toy-root", codec=None if codec == "none" else codec,
                             partitions=2, bucket_bytes=1 << 12)
    check_conformance(plan, ENGINES[engine][0])


def test_unknown_strategy_is_an_error_never_a_fallback():
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        casync.build_plan(SHAPES, workers=2, strategy="nope")
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        casync.build_plan(SHAPES, workers=2, strategy=["ring", "nope"])
