"""casync.torch without processes: option checks, residuals by parameter name, state dicts, error mapping."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import casync
import casync.torch as ct
from casync.errors import SyncError, SyncTimeoutError, WorkerLostError
from casync.torch.group import node_identity
from casync.transport.torchdist import as_sync_error
from casync.torch.plans import SyncOptions, plan_for_buckets
from casync.torch.residuals import check_named, ef_encodes, from_named, to_named
from casync.torch.runner import plan_fingerprint

BUCKETS = [[("fc.bias", (10,)), ("fc.weight", (10, 300))], [("conv.weight", (64, 3, 3, 3)), ("conv.bias", (64,))]]


def _plan(strategy: str = "ring", codec: str = "onebit", workers: int = 3, **extra) -> casync.SyncPlan:
    options = SyncOptions.make(strategy, codec, True, extra.pop("min_compress_bytes", 0), "propagate", extra,
                               fixed_buckets=True)
    return plan_for_buckets(options, BUCKETS, workers)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(servers=2, strategy="ps"), ValueError, "co-located"),
    (dict(bucket_bytes=1 << 20), ValueError, "bucket_cap_mb"),
    (dict(nonfinite="raise"), ValueError, "reducer unusable"),
    (dict(nonfinite="loud"), ValueError, "nonfinite must be one of"),
    (dict(frobnicate=1), TypeError, "unknown option"),
    (dict(cluster=casync.ClusterModel(nodes=2)), ValueError, "strategy='auto'"),
    (dict(strategy="auto", min_compress_bytes=10), ValueError, "selective compression"),
    (dict(strategy="butterfly"), ValueError, "butterfly"),
    (dict(codec="sevenbit"), ValueError, "sevenbit"),
    (dict(start_iter=-1), ValueError, "start_iter"),
    (dict(timeout_s=0), ValueError, "timeout_s"),
    (dict(transport="nccl"), ValueError, "transport"),
    (dict(check_every=-2), ValueError, "check_every"),
    (dict(partitions=0), ValueError, "partitions"),
])
def test_bad_options_are_refused_naming_the_option(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        ct.CasyncState(**kwargs)


def test_a_plan_keeps_the_given_buckets_and_leaves_small_ones_uncompressed():
    plan = _plan(min_compress_bytes=8_000)
    assert [[m.spec.name for m in b.members] for b in plan.buckets] == [[n for n, _ in g] for g in BUCKETS]
    assert [b.codec.name for b in plan.buckets] == ["onebit", "none"]  # 12,040 bytes, then 7,168 < 8,000
    assert plan.buckets[1].note and plan.nonfinite == "propagate"
    assert [b.priority for b in plan.buckets] == [1, 0]  # the last bucket of backward first
    with pytest.raises(ValueError, match="appears twice"):
        plan_for_buckets(SyncOptions(), [[("a", (2,))], [("a", (2,))]], 2)


@pytest.mark.parametrize("strategy", ["ring", "ps", "allgather"])
def test_residuals_by_parameter_name_convert_back_exactly(strategy):
    plan = _plan(strategy, "topk:ratio=0.1", workers=3, partitions=4)
    rng = np.random.default_rng(0)
    keyed = {key: rng.standard_normal(numel, dtype=np.float32)
             for key, numel in casync.engines.state.residual_shapes(plan).items()}
    named = to_named(plan, keyed)
    assert {role for role in named} == {role for _, role, *_ in ef_encodes(plan)}
    assert all(set(params) <= {t.name for t in plan.tensors} for params in named.values())
    back = from_named(plan, check_named(plan, {r: {n: torch.from_numpy(a) for n, a in p.items()}
                                               for r, p in named.items()}))
    assert back.keys() == keyed.keys() and all(np.array_equal(back[k], keyed[k]) for k in keyed)
    for actor in plan.actors:  # each rank takes its own encodes' residuals
        mine = from_named(plan, named, actor)
        assert all(a == actor for key, _, _, _, a in ef_encodes(plan) if key in mine)


def test_saved_residuals_that_do_not_fit_the_plan_are_refused():
    plan = _plan()
    with pytest.raises(ValueError, match="role 'server:0' that the plan does not use"):
        check_named(plan, {"server:0": {}})
    with pytest.raises(ValueError, match="'nope' that the plan does not sync"):
        check_named(plan, {"worker:0": {"nope": np.zeros(3, np.float32)}})
    with pytest.raises(ValueError, match=r"expected float32 of shape \(10,\)"):
        check_named(plan, {"worker:0": {"fc.bias": np.zeros(11, np.float32)}})
    with pytest.raises(ValueError, match="NaN or Inf"):
        check_named(plan, {"worker:0": {"fc.bias": np.full(10, np.nan, np.float32)}})
    with pytest.raises(ValueError, match="no entry for parameter"):  # an incomplete role
        check_named(plan, {"worker:0": {"fc.bias": np.zeros(10, np.float32)}})


def test_state_dict_round_trip_without_a_job_and_what_load_checks():
    state = ct.CasyncState(codec="onebit", strategy="ring")
    plan = _plan(workers=2)
    saved = {"format": "casync.torch", "version": 1, "iteration": 7, "plan": json.dumps(plan.to_dict()),
             "config": state.options.config(), "residuals": {}}
    state.load_state_dict(saved)
    assert state.iter == 7 and state.plan == plan and state.compressing
    again = state.state_dict()  # no job yet: what was loaded
    assert again["iteration"] == 7 and json.loads(again["plan"]) == plan.to_dict()
    other = ct.CasyncState(codec="topk:ratio=0.1")
    with pytest.raises(ValueError, match=r"other casync options: codec=\['onebit', \{\}\]"):
        other.load_state_dict(saved)
    with pytest.raises(ValueError, match="not a casync.torch state dict"):
        ct.CasyncState().load_state_dict({"version": 1})
    with pytest.raises(ValueError, match="version 9"):
        ct.CasyncState().load_state_dict(dict(saved, version=9))
    with pytest.raises(ValueError, match="iteration"):
        ct.CasyncState().load_state_dict(dict(saved, iteration=-1))
    with pytest.raises(ValueError, match="does not fit this model's gradients.*not synced now: \\['fc.bias'\\]"):
        state.check_parameters({t.name: t.shape for t in plan.tensors if t.name != "fc.bias"})
    with pytest.raises(TypeError, match="state_dict"):
        import pickle

        pickle.dumps(state)


def test_fingerprints_ignore_planner_timing_but_not_choices():
    plan = _plan()
    timed = casync.SyncPlan.from_dict(dict(plan.to_dict(), options=dict(plan.options, planner={"seconds": 1.5})))
    retimed = casync.SyncPlan.from_dict(dict(plan.to_dict(), options=dict(plan.options, planner={"seconds": 2.5})))
    assert plan_fingerprint(timed) == plan_fingerprint(retimed)
    assert plan_fingerprint(plan) != plan_fingerprint(_plan(codec="topk:ratio=0.1"))
    assert plan_fingerprint(plan, {"codec": "a"}) != plan_fingerprint(plan, {"codec": "b"})


def test_transport_failures_become_typed_errors():
    reset = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:6840: Connection reset by peer. This is typically")
    assert isinstance(as_sync_error(reset, "step 3"), WorkerLostError)
    assert isinstance(as_sync_error(SyncError(f"worker:0, step 3: RuntimeError: {reset}"), "x"), WorkerLostError)
    assert isinstance(as_sync_error(RuntimeError("Timed out waiting 8000ms for recv"), "x"), SyncTimeoutError)
    plain = as_sync_error(ValueError("odd"), "step 1")
    assert type(plain) is SyncError and "step 1: ValueError: odd" in str(plain)
    lost = WorkerLostError("gone")
    assert as_sync_error(lost, "x") is lost
    assert node_identity().count("/") == 2


def test_the_hook_and_the_optimizer_need_a_distributed_job():
    with pytest.raises(TypeError, match="CasyncState"):
        ct.comm_hook(object(), None)
    if not torch.distributed.is_initialized():
        model = torch.nn.Linear(2, 2)
        with pytest.raises(RuntimeError, match="init_process_group"):
            ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    with pytest.raises(ValueError, match="not in named_parameters"):
        a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        ct.DistributedOptimizer(torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1),
                                a.named_parameters())
