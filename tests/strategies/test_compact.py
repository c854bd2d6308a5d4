"""Compact (symmetric template) plans: small enough for 1024 workers, and faithful to the full plan."""
from __future__ import annotations

import time

import numpy as np
import pytest

import casync
from casync.plan.assemble import BucketChoice, assemble_plan, make_buckets, name_buckets
from casync.plan.tensors import tensor_specs
from casync.sim.costmodel import ClusterModel
from casync.sim.simulator import simulate
from primitives.codecs import get_codec


def plans(model, workers, strategy, codec, bucket_bytes=25 << 20, full=True):
    specs = tensor_specs(model)
    groups = name_buckets(specs, make_buckets(specs, bucket_bytes))
    parts = workers if strategy != "allgather" else None
    choices = [BucketChoice(strategy, get_codec(codec), partitions=parts)] * len(groups)
    compact = assemble_plan(specs, workers, groups, choices, options={"seed": 0}, compact=True)
    return (assemble_plan(specs, workers, groups, choices, options={"seed": 0}) if full else None), compact


@pytest.mark.parametrize("strategy", ["ring", "allgather", "ps"])
@pytest.mark.parametrize("codec", ["none", "onebit"])
@pytest.mark.parametrize("workers", [4, 8])
def test_template_predicts_the_full_plan(strategy, codec, workers):
    """On a symmetric cluster (one worker per node) ring and all-gather templates match the full simulation;
    the PS template is an optimistic bound (it schedules pushes and pulls without contention)."""
    full, compact = plans("resnet50", workers, strategy, codec)
    assert compact.graph.number_of_nodes() < full.graph.number_of_nodes()
    cluster = ClusterModel.for_workers(workers, bandwidth_gbps=10)
    t_full = simulate(full, cluster).iteration_time
    t_compact = simulate(compact, cluster).iteration_time
    if strategy == "ps":
        assert t_compact <= t_full * 1.01
    else:
        assert t_compact == pytest.approx(t_full, rel=0.02)


def test_per_worker_wire_bytes_match():
    full, compact = plans("resnet50", 8, "ring", "onebit")
    assert compact.wire_bytes() == pytest.approx(full.wire_bytes() / 8, rel=0.01)


def test_engines_refuse_templates():
    _, compact = plans("tiny", 2, "ring", "none")
    with pytest.raises(ValueError, match="compact"):
        casync.LocalEngine(compact)


def test_gpt2_ring_at_1024_workers_is_quick():
    """The scale target: GPT-2 bucketed, 1024-worker ring, simulated in well under a minute."""
    t0 = time.perf_counter()
    _, compact = plans("gpt2", 1024, "ring", "onebit", full=False)
    timeline = simulate(compact, ClusterModel(nodes=16, workers_per_node=64, bandwidth_gbps=100))
    elapsed = time.perf_counter() - t0
    assert compact.graph.number_of_nodes() < 400_000
    assert timeline.iteration_time > 0 and np.isfinite(timeline.iteration_time)
    assert elapsed < 60, elapsed
