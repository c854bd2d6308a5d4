"""The DDP communication hook on real gloo ranks: bit for bit LocalEngine, plain DDP's training without
compression, exact resume from a checkpoint, and clear errors for mismatched plans, drift and a dead rank."""
from __future__ import annotations

import numpy as np
import pytest

import casync
from tests.engines.conformance import SHAPES, step_grads
from tests.torch.harness import RankError, ok, run_ranks

CONFIGS = [dict(strategy=s, codec=c) for s in ("ring", "ps", "allgather") for c in ("none", "onebit", "topk:ratio=0.1")]
EXTRA = [dict(strategy="ring", codec="onebit", min_compress_bytes=10_000),  # small buckets stay uncompressed
         # the planner chooses per DDP bucket, for the times DDP handed them over (measured in warm-up) ...
         dict(strategy="auto", codec=["none", "onebit"], cluster=casync.ClusterModel(nodes=3, bandwidth_gbps=1)),
         # ... or for the ready times given; with bucket_bytes it fuses buckets of its own (copied in and out)
         dict(strategy="auto", codec=["none", "onebit"], cluster=casync.ClusterModel(nodes=3), ready_times={}),
         dict(strategy="auto", codec="onebit", partitions="auto", cluster=casync.ClusterModel(nodes=3),
              bucket_bytes=0),  # (0: one bucket per tensor)
         dict(strategy="ps", codec="onebit", compute_threads=2),  # ops at once on a rank: the same floats
         dict(strategy="ring", codec="topk:ratio=0.1", compute_threads=3),
         # DDP's .grad as views into its bucket buffers (as the benchmarks run it), which the hook writes into
         dict(strategy="allgather", codec="onebit", gradient_as_bucket_view=True),
         dict(strategy="ps", codec="topk:ratio=0.1", gradient_as_bucket_view=True),
         dict(strategy="ring", codec="none", gradient_as_bucket_view=True)]


def _reference(plan_data: dict, world: int, start: int, steps: int) -> list[list[dict]]:
    """LocalEngine's results for the steps from ``start`` on (the hook's earlier iterations were uncompressed)."""
    plan = casync.SyncPlan.from_dict(plan_data)
    engine = casync.LocalEngine(plan)
    engine.load_state_dict({"version": 1, "step": start, "workers": world, "residuals": {}})
    return [engine.sync(step_grads(world, step)) for step in range(start, steps)]


def test_hook_is_bit_identical_to_local_engine():
    world, steps = 3, 5
    results = ok(run_ranks("tests.torch.scenarios:synced_gradients", world, configs=CONFIGS + EXTRA, steps=steps))
    for index, config in enumerate(CONFIGS + EXTRA):
        runs = [r[index] for r in results]
        assert all(run["plan"] == runs[0]["plan"] for run in runs), f"{config}: ranks report different plans"
        assert runs[0]["iteration"] == steps
        plan = casync.SyncPlan.from_dict(runs[0]["plan"])
        if "bucket_bytes" in config:  # the planner's own buckets: gradients copied parameter by parameter
            assert plan.options["planner"] and len(plan.buckets) == len(SHAPES)
            assert {run["as_planned"] for run in runs} == {1}  # 'big', alone in DDP's buckets and the plan's
        elif config["strategy"] == "auto":  # a choice per DDP bucket, each synced in its DDP buffer
            assert len(plan.buckets) == 2 and plan.options["buckets"] == "given"
            assert {run["as_planned"] for run in runs} == {2}
            assert {run["in_place"] for run in runs} == {sum(b.strategy in ("ring", "ps") for b in plan.buckets)}
            ready = plan.options["planner"]["ready_s"]  # DDP's bucket 0 first, bucket 1 after it
            if config.get("ready_times") == {}:
                assert ready == [0.0, 0.0]
            else:
                assert ready[0] == 0.0 < ready[1] < 5.0, ready
        else:  # DDP's buckets ('big' alone, the rest fused)
            assert len(plan.buckets) == 2 and {b.strategy for b in plan.buckets} == {config["strategy"]}
        if "min_compress_bytes" in config:
            assert sorted(b.codec.name for b in plan.buckets) == ["none", "onebit"]
        # ring and PS write each result over its gradient in DDP's buffer (no copy back); all-gather's output
        # merge reads the gradient it would overwrite, so it writes a buffer of its own and copies
        in_place = {run["in_place"] for run in runs}
        if config["strategy"] in ("ring", "ps"):
            assert in_place == {2}, config
        elif config["strategy"] == "allgather":
            assert in_place == {0}, config
            # its result buffer is DDP's future value (DDP copies it into separate gradients), or, where the
            # gradients are views into DDP's buffer, written there
            assert {run["lent"] for run in runs} == ({0} if config.get("gradient_as_bucket_view") else {2}), config
        start = runs[0]["compressing_from"]
        for step in range(start):  # DDP's first iterations: uncompressed all-reduce, the exact mean
            exact = {n: np.mean([g[n] for g in step_grads(world, step)], axis=0) for n in SHAPES}
            for rank, run in enumerate(runs):
                for name in SHAPES:
                    np.testing.assert_allclose(run["grads"][step][name], exact[name], rtol=1e-5, atol=1e-6)
        want = _reference(runs[0]["plan"], world, start, steps)
        for step in range(start, steps):
            for rank, run in enumerate(runs):
                for name in SHAPES:
                    assert np.array_equal(run["grads"][step][name], want[step - start][rank][name]), \
                        f"{config}, step {step}, rank {rank}, {name}: differs from LocalEngine"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device (run where one exists; CI has none)")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_buckets_sync_to_the_bits_of_host_buckets(dtype):
    """DDP buckets on a GPU are staged through host memory, synced as float32 and cast back: every rank gets
    the bits the same ranks get with the buckets on the CPU (which the test above holds to LocalEngine)."""
    configs = [dict(strategy="ring", codec="onebit"), dict(strategy="ps", codec="topk:ratio=0.1"),
               dict(strategy="allgather", codec="none"), dict(strategy="ring", codec="randomk:ratio=0.1")]
    kw = dict(configs=configs, steps=4, dtype=dtype)
    host = ok(run_ranks("tests.torch.scenarios:synced_gradients", 2, device="cpu", **kw))
    gpu = ok(run_ranks("tests.torch.scenarios:synced_gradients", 2, device="cuda", **kw))
    for rank in range(2):
        for index, config in enumerate(configs):
            assert gpu[rank][index]["plan"] == host[rank][index]["plan"]
            for step in range(4):
                for name in SHAPES:
                    want, got = host[rank][index]["grads"][step][name], gpu[rank][index]["grads"][step][name]
                    assert got.tobytes() == want.tobytes(), f"{config} {dtype}, step {step}, rank {rank}, {name}"


def test_hook_with_codec_none_trains_like_plain_ddp():
    results = ok(run_ranks("tests.torch.scenarios:plain_vs_hook", 2))
    for r in results:
        for name, value in r["plain"].items():
            np.testing.assert_allclose(r["hook"][name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        assert r["losses"][-1] < r["losses"][0]
        assert r["half_dtype"] == "torch.bfloat16" and r["half_plan_buckets"] >= 2  # cast back, DDP's buckets
    for name in results[0]["hook"]:
        assert np.array_equal(results[0]["hook"][name], results[1]["hook"][name])
        assert np.array_equal(results[0]["half"][name], results[1]["half"][name])


@pytest.mark.parametrize("strategy", ["ring", "ps"])
def test_state_dict_round_trip_continues_bit_identically(strategy):
    results = ok(run_ranks("tests.torch.scenarios:resume", 2, strategy=strategy))
    for rank, r in enumerate(results):
        for name, value in r["straight"].items():
            assert np.array_equal(r["resumed"][name], value), f"rank {rank}, {name}: resumed run differs"
        assert r["iteration"] == 5
        assert r["residual_roles"] == r["plan_roles"] and r["owners"] == ["worker:0", "worker:1"]  # every rank's
        assert "codec=['onebit', {}] (now ['topk', {'ratio': 0.1}])" in r["refused"]["options"]
        assert "does not fit this model's gradients" in r["refused"]["model"]
        assert "parameters in the plan but not synced now: ['4.bias', '4.weight']" in r["refused"]["model"]
        assert "2.weight (32, 64) -> (5, 64)" in r["refused"]["model"]


def test_the_plan_takes_ddps_final_buckets_with_static_graph_and_after_an_early_resume():
    for r in ok(run_ranks("tests.torch.scenarios:layouts", 2)):
        dynamic, static, early = r["static=False"], r["static=True"], r["resumed early"]
        assert dynamic["ddp_buckets"] > 1 and static["plan"] == dynamic["plan"]
        assert dynamic["as_planned"] == static["as_planned"] == dynamic["ddp_buckets"]  # DDP's buffers, no copies
        assert early["saved_iteration"] == 1 and early["plan"] == dynamic["plan"]
        assert early["as_planned"] == dynamic["ddp_buckets"]


def test_sparse_gradients_are_refused_clearly_by_the_hook_and_the_optimizer():
    for r in ok(run_ranks("tests.torch.scenarios:sparse_refused", 2)):
        assert "TypeError: DDP's bucket of ['weight'] holds torch.sparse_coo gradients" in r["hook"]
        assert "TypeError: parameter 'weight' has a torch.sparse_coo gradient" in r["optimizer"]
        assert all("dense gradients only" in m for m in r.values())


def test_ranks_with_different_plans_fail_clearly_on_every_rank():
    results = run_ranks("tests.torch.scenarios:mismatched_plans", 2)
    for r in results:
        assert not isinstance(r, RankError), r
        assert r["kind"] == "PlanMismatchError", r
        assert "the ranks built different sync plans" in r["message"] and "rank 1:" in r["message"]
        assert r["iteration"] == 2  # the two uncompressed iterations ran; nothing was sent with the plans


@pytest.mark.parametrize("setting", ["transport", "start_iter"])
def test_ranks_with_different_settings_fail_clearly_on_every_rank_before_syncing(setting):
    for r in run_ranks("tests.torch.scenarios:mismatched_plans", 2, setting=setting):
        assert not isinstance(r, RankError), r
        assert r["kind"] == "PlanMismatchError" and r["iteration"] == 0, r
        assert f"the ranks set casync up differently ({setting}: rank 0 " in r["message"], r
        assert r["elapsed"] < 15, r  # not a timeout


def test_skip_voids_a_nonfinite_step_in_the_warm_up_too():
    for r in ok(run_ranks("tests.torch.scenarios:skip_in_warmup", 2)):
        assert [(step, nan, skipped) for step, nan, _, skipped in r] == [
            (0, False, False), (1, False, True), (2, False, False), (3, False, False), (4, False, True)]
        assert [total for step, _, total, _ in r if step in (1, 4)] == [0.0, 0.0]  # zeros on every rank


def test_replica_drift_is_caught_on_every_rank():
    for r in run_ranks("tests.torch.scenarios:drift", 2):
        assert not isinstance(r, RankError), r
        assert r["kind"] == "ReplicaMismatchError", r
        assert "step 4" in r["message"] and "drifted" in r["message"]


def test_a_dead_rank_is_a_typed_error_within_the_timeout_on_the_others():
    timeout_s = 8.0
    results = run_ranks("tests.torch.scenarios:dies", 3, group_timeout=timeout_s)
    assert isinstance(results[2], RankError) and results[2].kind == "died"
    for r in results[:2]:
        assert not isinstance(r, RankError), r
        assert r["kind"] in ("WorkerLostError", "SyncTimeoutError"), r
        assert r["error"] == r["kind"]
        assert r["elapsed"] < timeout_s + 10, r


@pytest.mark.parametrize("where", ["encode", "hook"])
def test_a_sync_failing_on_one_rank_fails_every_rank_at_once_naming_it(tmp_path, where):
    results = run_ranks("tests.torch.scenarios:op_fails", 3, flags=str(tmp_path), where=where, group_timeout=30.0,
                        timeout_s=120)
    for rank, r in enumerate(results):
        assert not isinstance(r, RankError), r
        assert r["kind"] == ("RuntimeError" if rank == 1 and where == "hook" else "SyncError"), r
        assert r["error"] == r["kind"], r
        assert ("worker:1" in r["message"] or rank == 1) and f"{where} failed on purpose" in r["message"], r
        assert r["elapsed"] < 15, r  # not the 30 s timeout


@pytest.mark.parametrize("transport", ["gloo", "direct"])
def test_a_rank_that_dies_is_named_in_every_survivors_error(transport):
    """Rank 1 of 3 dies before its step-3 sync: whichever survivor notices first (its receive from worker:1
    fails) tells the other, and both raise a WorkerLostError that names worker:1, at once."""
    results = run_ranks("tests.torch.scenarios:dies_in_forward", 3, transport=transport, timeout_s=120)
    assert isinstance(results[1], RankError) and results[1].kind == "died", results[1]
    for rank in (0, 2):
        r = results[rank]
        assert not isinstance(r, RankError), r
        assert r["kind"] == "WorkerLostError" and r["lost"] == "worker:1", r
        assert "worker:1 was lost in step 3" in r["message"] or "worker:1 left the group" in r["message"], r
        assert r["elapsed"] < 15, r  # not the 30 s timeout


@pytest.mark.parametrize("batches", [[20, 8], [1, 20]], ids=["8-of-20", "1-of-20"])
def test_join_with_uneven_inputs_gives_plain_ddps_model_with_codec_none(batches):
    """Under ``ddp.join()`` a rank out of inputs shadows the others' syncs with zero gradients (DDP calls the hook
    from its join hook): codec none gives plain DDP's parameters bit for bit, the parameter check compares only
    the ranks that took the step (a joined rank's are stale until DDP hands it the final model), and a rank that
    joins before the first compressed step (1 batch) is no exception."""
    results = ok(run_ranks("tests.torch.scenarios:uneven_join", 2, batches=batches, check_every=1))
    for r in results:
        assert r["casync"]["steps"] == max(batches)  # the joined rank counted every step too
        for name, value in r["plain"]["params"].items():
            assert np.array_equal(r["casync"]["params"][name], value), name
    for name, value in results[0]["casync"]["params"].items():  # DDP's final sync: one model on every rank
        assert np.array_equal(results[1]["casync"]["params"][name], value), name


def test_join_with_uneven_inputs_trains_with_onebit():
    results = ok(run_ranks("tests.torch.scenarios:uneven_join", 2, batches=[20, 8], codec="onebit", check_every=1))
    for name, value in results[0]["casync"]["params"].items():
        assert np.array_equal(results[1]["casync"]["params"][name], value), name
        assert np.isfinite(value).all()
    for r in results:  # it learns its 4 batches (random targets: slowly) about as plain DDP does
        losses, plain = r["casync"]["losses"], r["plain"]["losses"]
        assert np.mean(losses[-4:]) < np.mean(losses[:4]), losses
        assert np.mean(losses[-4:]) < 1.03 * np.mean(plain[-4:]), (losses, plain)


def test_nonfinite_gradients_propagate_or_skip_alike_on_every_rank():
    world = 2
    results = ok(run_ranks("tests.torch.scenarios:nonfinite", world))
    for r in results:
        assert r["propagate_skipped"] is False and r["skip_skipped"] is True
        assert r["skip_residuals_kept"] is True
        assert np.isnan(r["propagate"][3]["big"][7]) and np.isfinite(np.delete(r["propagate"][3]["big"], 7)).all()
        for name in SHAPES:
            assert not r["skip"][3][name].any()  # voided: zeros on every rank
            assert np.array_equal(r["propagate"][3][name], results[0]["propagate"][3][name], equal_nan=True)
    assert all(np.array_equal(results[0]["skip"][4][n], results[1]["skip"][4][n]) for n in SHAPES)


def test_a_layer_frozen_after_wrapping_trains_on_and_resumes():
    results = ok(run_ranks("tests.torch.scenarios:frozen_after_wrapping", 2))
    for r in results:
        assert r["after_wrap"]["iteration"] == 4
        assert r["after"] == {"iteration": 6}  # resumed, frozen after wrapping again
        assert "parameters in the plan but not synced by DDP now: ['0.bias', '0.weight']" in r["before"]["error"]
        assert r["before"]["elapsed"] < 10  # at the end of the first iteration, not a timeout
    for name, value in results[0]["after_wrap"]["params"].items():
        assert np.array_equal(results[1]["after_wrap"]["params"][name], value)


@pytest.mark.parametrize("mode", ["rank 0 only", "other"])
def test_a_checkpoint_loaded_on_some_ranks_only_is_a_clear_error_on_every_rank(mode):
    for r in run_ranks("tests.torch.scenarios:loaded_on_some_ranks", 2, mode=mode):
        assert not isinstance(r, RankError), r
        assert r["kind"] == "PlanMismatchError", r
        assert "steps done (load_state_dict): rank 0 3, rank 1 " in r["message"], r
        assert "load the same casync state dict" in r["message"] and r["elapsed"] < 10, r


def test_the_optimizer_refuses_a_checkpoint_loaded_on_some_ranks_only():
    for r in run_ranks("tests.torch.optimizer_scenarios:loaded_on_rank_0_only", 2):
        assert not isinstance(r, RankError), r
        assert r["kind"] == "PlanMismatchError", r
        assert "the ranks are at different steps (rank 0 3, rank 1 0)" in r["message"], r


def test_buckets_handed_over_before_the_step_opens_wait_for_it_and_give_the_same_bits():
    """The background thread opens each step (posting its receives) while backward goes on; buckets DDP hands
    over before that are handed to the step once it is open. Slowed down, every bucket comes early, and the
    gradients are bit for bit the prompt run's; one step thread serves all steps and ends with the state."""
    results = ok(run_ranks("tests.torch.scenarios:late_open", 2))
    for rank, r in enumerate(results):
        prompt, late = r["prompt"], r["late"]
        assert late["provides"] == prompt["provides"] > 0
        assert late["handed_before_open"] == late["provides"], late  # 0.15 s late: every bucket waited
        for step, (a, b) in enumerate(zip(prompt["grads"], late["grads"])):
            for name in a:
                assert np.array_equal(a[name], b[name]), f"rank {rank}, step {step}, {name}"
        for run in (prompt, late):
            assert run["threads"] == [f"casync-steps-worker:{rank}"] and run["left"] == [], run
