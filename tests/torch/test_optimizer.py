"""casync.torch.DistributedOptimizer on real gloo ranks: bit for bit LocalEngine, gradient accumulation,
parameters broadcast from rank 0, clipping between synchronize() and step(), and exact resume."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import casync
from tests.engines.conformance import SHAPES, step_grads
from tests.torch.harness import RankError, ok, run_ranks


def test_synchronized_gradients_are_local_engines_and_accumulate_over_passes():
    world = 3
    results = ok(run_ranks("tests.torch.optimizer_scenarios:synced", world))
    plan = casync.SyncPlan.from_dict(results[0]["plan"])
    assert len(plan.buckets) >= 2
    reference = casync.LocalEngine(plan)
    for step in range(4):
        want = reference.sync(step_grads(world, step))
        for rank, r in enumerate(results):
            for name in SHAPES:
                assert np.array_equal(r["grads"][step][name], want[rank][name]), f"step {step}, rank {rank}, {name}"
    accumulated = casync.LocalEngine(casync.SyncPlan.from_dict(results[0]["acc_plan"]))
    for step in range(2):
        first, second = step_grads(world, 2 * step), step_grads(world, 2 * step + 1)
        want = accumulated.sync([{n: a[n] + b[n] for n in SHAPES} for a, b in zip(first, second)])
    for rank, r in enumerate(results):
        for name in SHAPES:
            assert np.array_equal(r["acc"][name], want[rank][name]), f"accumulated, rank {rank}, {name}"
        assert "got a gradient 3 times since the last step(); backward_passes_per_step is 2" in r["too_many"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run where one exists; CI has none)")
def test_cuda_parameters_sync_to_the_bits_of_host_parameters():
    """Gradients on a GPU are staged through host memory: the bits of the same ranks on the CPU."""
    host = ok(run_ranks("tests.torch.optimizer_scenarios:synced", 2))
    gpu = ok(run_ranks("tests.torch.optimizer_scenarios:synced", 2, device="cuda"))
    for h, g in zip(host, gpu):
        assert g["plan"] == h["plan"] and g["too_many"] == h["too_many"]
        for step in range(4):
            assert all(g["grads"][step][n].tobytes() == h["grads"][step][n].tobytes() for n in SHAPES), step
        assert all(g["acc"][n].tobytes() == h["acc"][n].tobytes() for n in SHAPES)


def test_training_broadcasts_clips_schedules_and_resumes_exactly():
    results = ok(run_ranks("tests.torch.optimizer_scenarios:training", 2))
    for name in results[0]["start"]:
        assert np.array_equal(results[1]["start"][name], results[0]["start"][name])  # rank 0's parameters
    assert np.array_equal(results[1]["frozen"], results[0]["frozen"])  # frozen ones too
    assert [r["groups_after_close"] for r in results] == [0, 0]  # close() destroys casync's process groups
    for rank, r in enumerate(results):
        assert r["lr"] == 0.05 * 0.5 ** 3  # the scheduler drove the wrapped optimizer (7 steps, halving every 2)
        for name, value in r["straight"].items():
            assert np.array_equal(r["resumed"][name], value), f"rank {rank}, {name}: resumed run differs"
            assert np.array_equal(value, results[0]["straight"][name])


def test_grad_scaler_overflow_skips_one_step_and_a_bare_scaler_step_is_refused():
    results = ok(run_ranks("tests.torch.optimizer_scenarios:grad_scaler", 2))
    for r in results:
        assert r["applied"] == [False, True, True, True]  # the overflow step skipped, the next ones synced
        for name, value in r["params"].items():  # (a step applied with local gradients would split them)
            assert np.array_equal(value, results[0]["params"][name]), name
        assert "were changed after backward but before synchronize()" in r["bare"], r["bare"]
        assert "'0.weight'" in r["bare"]


def test_an_op_failing_on_one_rank_fails_every_ranks_step_at_once_naming_it():
    results = run_ranks("tests.torch.optimizer_scenarios:op_fails", 3)
    for rank, r in enumerate(results):
        assert not isinstance(r, RankError), r
        assert r["kind"] == "SyncError" and "encode failed on purpose" in r["message"], r
        assert rank == 1 or "worker:1 failed in step 2" in r["message"], r
        assert r["elapsed"] < 3.5, r  # not the 30 s timeout; and before rank 1's process ends
