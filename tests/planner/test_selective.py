"""Selective compression as a stated rule: material gains only, ties to no compression, monotone in size."""
from __future__ import annotations

import pytest

import casync
from casync.plan.assemble import BucketChoice, assemble_plan
from casync.planner import min_gain
from casync.sim.costmodel import ClusterModel, Profile
from casync.sim.simulator import simulate
from casync.primitives.codecs import get_codec
from tests.planner import hipress

CNNS = ["resnet50", "vgg16"]
TRANSFORMERS = ["bert-base", "gpt2"]


def setting(name: str) -> dict:
    """Packaged profile on 4 nodes at 10 Gbit/s with onebit, or HiPress's fits with their 2-bit codec."""
    if name == "hipress":
        return dict(cluster=hipress.cluster(4), profile=hipress.profile(), codec=["none", hipress.CODEC])
    return dict(cluster=ClusterModel.for_workers(4, bandwidth_gbps=10), profile=Profile.default(),
                codec=["none", "onebit"])


def assert_monotone(plan: casync.SyncPlan) -> None:
    """Compressing a bucket implies compressing every larger one (equal sizes alike); partitions never
    decrease with size (per strategy)."""
    rows = sorted((b.numel, not b.codec.lossless, b.strategy, len(b.partitions), b.name) for b in plan.buckets)
    packed = [numel for numel, c, _, _, _ in rows if c]
    if packed:
        cut = min(packed)
        plain = [(numel, name) for numel, c, _, _, name in rows if not c and numel >= cut]
        assert not plain, f"{plain[:3]} left uncompressed though a bucket of {cut} elements is compressed"
    for strategy in {r[2] for r in rows}:
        counts = [(numel, k) for numel, _, s, k, _ in rows if s == strategy]
        for (n0, k0), (n1, k1) in zip(counts, counts[1:]):
            assert k1 >= k0 and (n1 != n0 or k1 == k0), f"{strategy}: {k0} partitions at {n0}, {k1} at {n1}"


@pytest.mark.parametrize("model", CNNS + TRANSFORMERS)
@pytest.mark.parametrize("where", ["packaged", "hipress"])
def test_one_tensor_per_bucket_choices_are_monotone_in_size(model, where):
    """The issue's case: PS on a few nodes, none or one codec, partitions="auto", one tensor per bucket."""
    s = setting(where)
    plan = casync.build_plan(model, workers=4, strategy="ps", codec=s["codec"], partitions="auto", bucket_bytes=0,
                             cluster=s["cluster"], profile=s["profile"])
    assert_monotone(plan)
    assert any(not b.codec.lossless for b in plan.buckets), "large tensors pay for compression here"
    for b in plan.buckets:
        if b.numel <= 16384:  # biases, norms, small convolutions: never worth a codec
            assert b.codec.lossless and len(b.partitions) == 1, (b.name, b.codec, b.note)
    assert all(b.note for b in plan.buckets)


@pytest.mark.parametrize("model", ["resnet50", "bert-base"])
def test_ring_alone_is_monotone_too(model):
    s = setting("hipress")
    plan = casync.build_plan(model, workers=4, strategy="ring", codec=s["codec"], partitions="auto", bucket_bytes=0,
                             cluster=s["cluster"], profile=s["profile"])
    assert_monotone(plan)


def test_hipress_fits_are_one_link():
    """The PS fits agree with the ring fit's link: a 4-node gather is 3 transfers into one host."""
    per_element = 4 / hipress.link_bytes_per_s() * 1e3  # ms per float32 on the link
    assert 3 * per_element == pytest.approx(hipress.PS_GATHER_4[1], rel=0.1)
    assert 3 * per_element == pytest.approx(hipress.PS_BROADCAST_4[1], rel=0.1)
    for fit, overhead in ((hipress.ENCODE, "encode"), (hipress.DECODE, "decode"), (hipress.RING_STEP, "ring"),
                          (hipress.PS_GATHER_4, "gather"), (hipress.PS_BROADCAST_4, "broadcast")):
        assert fit[0] >= hipress.OVERHEADS[overhead]  # so max(overhead, A + B x) is A + B x: linear


def twin_without_compression(plan: casync.SyncPlan) -> casync.SyncPlan:
    groups = [(b.name, [m.spec for m in b.members]) for b in plan.buckets]
    choices = [BucketChoice(b.strategy, get_codec("none"), partitions=len(b.partitions), two_way=b.two_way)
               for b in plan.buckets]
    return assemble_plan(plan.tensors, plan.workers, groups, choices)


MIXED = {"fc.weight": (2048, 1024), "fc.bias": (2048,), "ln.weight": (1024,), "conv.weight": (128, 128, 3, 3),
         "emb.weight": (8192, 256), "tiny": (10,)}


@pytest.mark.parametrize("gbps", [1, 10, 40, 100])
def test_compression_gains_at_least_min_gain_in_simulation(gbps):
    """Where the plan compresses, the same plan without compression simulates at least min_gain slower (1% of
    the iteration, 50 us), unless that would lose to a fixed plan; otherwise it is not compressed."""
    cl = ClusterModel.for_workers(8, bandwidth_gbps=gbps)
    plan = casync.build_plan(MIXED, workers=8, strategy="auto", codec=["none", "onebit"], partitions="auto",
                             bucket_bytes=0, cluster=cl)
    assert_monotone(plan)
    t = simulate(plan, cl).iteration_time
    if any(not b.codec.lossless for b in plan.buckets):
        t_plain = simulate(twin_without_compression(plan), cl).iteration_time
        best_fixed = min(simulate(casync.build_plan(MIXED, workers=8, strategy=s, codec=c, bucket_bytes=0),
                                  cl).iteration_time for s in ("ring", "ps", "allgather") for c in ("none", "onebit"))
        assert t_plain - t >= min_gain(t) or t_plain > best_fixed, (t, t_plain, best_fixed)
    assert plan.options["planner"]["min_gain_s"] == pytest.approx(min_gain(t))


def test_ties_go_to_no_compression():
    """fp16 halves the bytes but on a fast link that saves less than min_gain: nothing is compressed."""
    cl = ClusterModel.for_workers(4, bandwidth_gbps=100, latency_us=5)
    plan = casync.build_plan({"w": (4096,), "b": (512,)}, workers=4, strategy="ring", codec=["none", "fp16"],
                             bucket_bytes=0, cluster=cl)
    assert all(b.codec.name == "none" for b in plan.buckets), plan.summary()
    assert all("compress" in b.note or "small" in b.note for b in plan.buckets)


def test_min_gain_rule():
    assert min_gain(0.001) == pytest.approx(50e-6)  # the floor
    assert min_gain(0.2) == pytest.approx(0.002)  # 1% of the iteration
