"""DGC's and CD-SGD's accuracy keepers in casync.torch (the DDP hook and DistributedOptimizer): each against a
small case computed by hand, exact resume mid-warm-up and mid-compression, and clear refusals."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import casync
import casync.torch as ct
from casync.torch.keepers import KeeperOptions, LocalKeepers
from casync.training.dgc import MomentumCorrection, clip_by_global_norm, sent_mask
from casync.training.full_sync import is_full_sync
from tests.engines.conformance import SHAPES, step_grads
from tests.torch.harness import ok, run_ranks

f32 = np.float32


# -- units: no process group -------------------------------------------------------------------------------------
def test_clipping_threshold_scales_with_one_over_sqrt_of_the_ranks():
    a, b = torch.tensor([3.0]), torch.tensor([4.0])  # global norm 5
    assert clip_by_global_norm([a, b], 2 * math.sqrt(2), workers=2) == 5.0  # threshold 2: scaled by 2/5
    assert float(torch.linalg.vector_norm(torch.cat([a, b]))) == pytest.approx(2.0, abs=1e-6)
    assert (float(a), float(b)) == (pytest.approx(1.2, abs=1e-7), pytest.approx(1.6, abs=1e-7))
    c = torch.tensor([3.0, 4.0])
    clip_by_global_norm([c], 2 * math.sqrt(2), workers=1)  # one rank: the threshold itself
    assert float(torch.linalg.vector_norm(c)) == pytest.approx(2 * math.sqrt(2), abs=1e-6)
    small = torch.tensor([0.6, 0.8])
    clip_by_global_norm([small], 2 * math.sqrt(2), workers=2)
    assert small.tolist() == [f32(0.6), f32(0.8)]  # norm 1 <= 2: untouched
    bad = torch.tensor([float("inf"), 1.0])
    clip_by_global_norm([bad], 1.0, workers=4)
    assert bad[1] == 1.0  # a non-finite norm clips nothing (the NaN/Inf policy decides)


def test_momentum_is_kept_from_before_a_voided_step_and_masked_where_the_residual_is_zero():
    keepers = LocalKeepers(KeeperOptions(momentum_correction=0.5, momentum_masking=True), {"w": torch.zeros(4)}, 2)
    g = torch.tensor([1.0, 2.0, 3.0, 4.0])
    keepers.apply([("w", g)])
    assert g.tolist() == [1, 2, 3, 4]  # u = g at the first step
    keepers.finish()
    g2 = torch.tensor([2.0, 2.0, 2.0, 2.0])
    keepers.apply([("w", g2)])
    assert g2.tolist() == [2.5, 3, 3.5, 4]  # u = 0.5*u + g
    keepers.finish(voided=True)
    assert keepers.momentum.buffers["w"].tolist() == [1, 2, 3, 4]  # back to before the voided step
    plan = casync.build_plan([("w", (4,))], workers=2, strategy="allgather", codec="topk:ratio=0.5")
    key = f"worker:1/{plan.buckets[0].name}/0"
    keepers.apply([("w", torch.zeros(4))])
    keepers.finish(residuals={key: np.array([0, 1, 0, 2], f32)}, actor="worker:1", plan=plan)
    assert keepers.momentum.buffers["w"].tolist() == [0, 1, 0, 2]  # 0.5*u, zero where the residual is
    assert sent_mask({"x/b/0": np.array([0, 1], f32), "x/b/1": np.array([2, 0], f32)}, "x", "b",
                     [(0, 2), (2, 4)], 4).tolist() == [True, False, False, True]
    mc = MomentumCorrection(0.5, {"w": torch.zeros(2)})
    mc.correct("w", torch.tensor([5.0, 6.0]))
    mc.mask_sent({"x/b/0": np.array([0, 3], f32)}, "x", {"b": ([(0, 2)], 2, [("w", 0, 2)])})  # the Trainer's path
    assert mc.buffers["w"].tolist() == [0, 6]


def test_momentum_into_a_spare_buffer_gives_the_in_place_floats_and_voids_without_a_copy():
    """correct_into (blocks in cache, the new u in a spare) matches correct() + copy bit for bit, over block edges,
    with -0.0, NaN and a tail; the keepers alternate two buffers per parameter, and a voided step swaps back."""
    from casync.training.dgc import MOMENTUM_BLOCK

    n = 2 * MOMENTUM_BLOCK + 17
    rng = np.random.default_rng(3)
    u0 = torch.from_numpy(rng.standard_normal(n).astype(f32) * 1e3)
    g = torch.from_numpy(rng.standard_normal(n).astype(f32))
    g[5], g[MOMENTUM_BLOCK] = -0.0, float("nan")
    u0[5] = 0.0
    ref = MomentumCorrection(0.9, {"w": torch.zeros(n)})
    ref.buffers["w"].copy_(u0)
    want = ref.correct("w", g.clone()).clone()
    fused = MomentumCorrection(0.9, {"w": torch.zeros(n)})
    fused.buffers["w"].copy_(u0)
    old, spare, grad = fused.buffers["w"], torch.empty(n), g.clone()
    assert fused.correct_into("w", grad, spare) is spare and fused.buffers["w"] is spare
    assert torch.equal(old, u0)  # the old buffer only read
    for got in (spare, grad):
        assert np.array_equal(got.numpy().view(np.uint32), want.numpy().view(np.uint32))  # -0.0 and NaN alike
    half = torch.ones(3, dtype=torch.float16)  # not float32: the unblocked path, the same result
    mc = MomentumCorrection(0.5, {"w": torch.zeros(3)})
    mc.correct_into("w", half, torch.empty(3))
    assert half.tolist() == [1.0, 1.0, 1.0] and mc.buffers["w"].tolist() == [1.0, 1.0, 1.0]

    keepers = LocalKeepers(KeeperOptions(momentum_correction=0.5), {"w": torch.zeros(4)}, 2)
    first = keepers.momentum.buffers["w"]
    keepers.apply([("w", torch.ones(4))])
    keepers.finish()
    second = keepers.momentum.buffers["w"]
    assert second is not first and second.tolist() == [1, 1, 1, 1]
    keepers.apply([("w", torch.ones(4))])
    assert keepers.momentum.buffers["w"] is first  # the buffer from two steps ago, written again
    keepers.finish(voided=True)
    assert keepers.momentum.buffers["w"] is second and second.tolist() == [1, 1, 1, 1]
    keepers.voidable = False  # DistributedOptimizer's delayed update: u in place, no spare
    keepers.apply([("w", torch.ones(4))])
    assert keepers.momentum.buffers["w"] is second and second.tolist() == [1.5] * 4


def test_masking_zeroes_exactly_where_the_residual_is_zero():
    """The masked copy (NumPy's where=) against the bool index it replaced: -0.0 counts as zero, NaN does not."""
    n = 1000
    rng = np.random.default_rng(4)
    residual = rng.standard_normal(n).astype(f32)
    residual[rng.choice(n, 50, replace=False)] = 0.0
    residual[:3] = [-0.0, np.nan, np.inf]
    u = torch.from_numpy(rng.standard_normal(n).astype(f32))
    want = u.clone()
    want[torch.from_numpy(residual == 0)] = 0.0
    mc = MomentumCorrection(0.9, {"w": torch.zeros(n)})
    mc.buffers["w"].copy_(u)
    mc.mask_sent({"x/b/0": residual}, "x", {"b": ([(0, n)], n, [("w", 0, n)])})
    assert torch.equal(mc.buffers["w"], want) and int((mc.buffers["w"] == 0).sum()) == 51


def test_full_precision_steps_are_the_first_k_and_every_kth():
    assert [is_full_sync(t, 3, start=2) for t in range(9)] == [True, True, True, False, False, True, False, False,
                                                                True]
    assert not any(is_full_sync(t, None) for t in range(5))


def test_bad_values_and_combinations_are_refused_at_once():
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="cannot delay an update across iterations"):
        ct.CasyncState(delayed_update=True)
    with pytest.raises(ValueError, match="needs the delayed update, which a DDP comm hook cannot do"):
        ct.CasyncState(local_compensation=0.1)
    with pytest.raises(ValueError, match=r"full_sync_every=k\)\); the hook's full-precision warm-up is"):
        ct.CasyncState(full_sync_every=4)
    ct.CasyncState(delayed_update=False)  # the default, spelled out: fine
    with pytest.raises(ValueError, match="momentum_masking needs sparse codecs .* got codec onebit"):
        ct.CasyncState(codec="onebit", momentum_correction=0.9, momentum_masking=True)
    with pytest.raises(ValueError, match="warmup_steps needs a sparse codec with a ratio"):
        ct.CasyncState(codec="onebit", warmup_steps=3)
    with pytest.raises(ValueError, match=r"has momentum of its own \(momentum=0.9"):
        ct.CasyncState(momentum_correction=0.9, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    with pytest.raises(ValueError, match=r"the wrapped optimizer has momentum of its own \(betas="):
        adam_like = torch.optim.Optimizer(model.parameters(), {"betas": (0.9, 0.999)})  # (Adam's first use is slow)
        ct.DistributedOptimizer(adam_like, model.named_parameters(), momentum_correction=0.9)
    with pytest.raises(ValueError, match="masks the corrected momentum: set momentum_correction too"):
        ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                codec="topk", momentum_masking=True)
    with pytest.raises(ValueError, match="momentum_masking needs step t's sent coordinates"):
        ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                codec="topk", momentum_correction=0.9, momentum_masking=True, delayed_update=True)
    with pytest.raises(ValueError, match="local_compensation stands in for the update still in flight"):
        ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                local_compensation=0.1)
    with pytest.raises(ValueError, match="delayed_update takes nonfinite='propagate' only"):
        ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                delayed_update=True, nonfinite="skip")
    for bad, error, match in [(dict(dgc_clip_norm=0.0), ValueError, "dgc_clip_norm must be a finite number > 0"),
                              (dict(dgc_clip_norm="1"), TypeError, "dgc_clip_norm must be a number"),
                              (dict(momentum_correction=1.0), ValueError, r"momentum_correction must be in \[0.0, 1.0\)"),
                              (dict(warmup_steps=-1), ValueError, "warmup_steps must be >= 0"),
                              (dict(warmup_start_ratio=0.0), ValueError, "warmup_start_ratio must be > 0"),
                              (dict(full_sync_every=0), ValueError, "full_sync_every must be >= 1"),
                              (dict(delayed_update=True, local_compensation=float("nan")), ValueError,
                               "local_compensation must be a finite number > 0"),
                              (dict(start_iter=-1), ValueError, "start_iter must be an int >= 0")]:
        with pytest.raises(error, match=match):
            ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), **bad)


def test_the_trainers_modules_casync_torch_shares_import_no_ray():
    """casync.torch imports casync.training's dgc, full_sync and options in torchrun processes: the package must
    not import the Trainer (and Ray) with them."""
    code = "import sys, casync.training.full_sync, casync.training.options; print('ray' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr


# -- on 2 gloo ranks: every scenario in one start of the ranks ----------------------------------------------------
@pytest.fixture(scope="module")
def runs():
    return ok(run_ranks("tests.torch.keeper_scenarios:every_scenario", 2))


def scenario(runs: list, name: str) -> list:
    """One scenario's result on each rank, after asserting that it raised nowhere."""
    parts = [r[name] for r in runs]
    failed = [f"rank {rank}: {p['error']}" for rank, p in enumerate(parts) if isinstance(p, dict) and "error" in p]
    assert not failed, "\n".join(failed)
    return parts


def test_clipping_momentum_correction_and_masking_by_hand(runs):
    results = scenario(runs, "clip_and_momentum")
    clipped = [f32(3) * f32(0.4), f32(4) * f32(0.4)], [f32(0.6), f32(0.8)]  # rank 0's norm 5 -> 2; rank 1's kept
    mean = {"a": (clipped[0][0] + clipped[1][0]) / 2, "b": (clipped[0][1] + clipped[1][1]) / 2}  # ~0.9, ~1.2
    for r in results:
        for name in ("a", "b"):
            assert r["clipped"][name][0] == pytest.approx(mean[name], abs=1e-6)
        # (a threshold of 2.83 without the N^-1/2 scaling would give a = 1.149)
        for step, factor in enumerate([1.0, 1.5, 1.75, 1.875]):  # u = sum of 0.5**j * clipped g, synced
            for name in ("a", "b"):
                assert r["hook"][step][name][0] == pytest.approx(factor * mean[name], abs=2e-6), (step, name)
        assert r["hook_buckets"] == 2  # clipped across buckets: the global norm
        # topk 1 of 4, allgather, m = 0.5: by hand (see keeper_scenarios.MASK_GRADS)
        first, second = r["masked"]
        assert first["synced"].tolist() == [2, 1.5, 0, 0]  # rank 0 sends 4 at 0, rank 1 sends 3 at 1; mean
        assert first["e"] == {"worker:0": pytest.approx([0, 1, 2, 0.5]), "worker:1": pytest.approx([1, 0, 0.5, 2])}
        assert first["u"]["worker:0"].tolist() == [0, 1, 2, 0.5]  # masked where sent
        assert first["u"]["worker:1"].tolist() == [1, 0, 0.5, 2]
        assert second["synced"].tolist() == [0, 0, 2.5, 2.5]  # u + e = [4, 2.5, 5, 1.25] and [2.5, 3, 1.25, 5]
        assert second["u"]["worker:0"].tolist() == [4, 1.5, 0, 0.75]
        assert second["u"]["worker:1"].tolist() == [1.5, 3, 0.75, 0]
        assert second["e"]["worker:0"].tolist() == [4, 2.5, 0, 1.25]


def test_sparsity_warmup_switches_the_density_at_the_expected_steps(runs):
    for r in scenario(runs, "warmup"):
        assert r["optimizer"] == [16, 8, 4, 4]  # densities 1, 0.5, 0.25 (warmup_steps=2), then the codec's
        # the hook: iterations 0-1 uncompressed (all 16), then 1 * 0.25**(i/4): i=2 -> 8, 3 -> ceil(5.66), 4.. -> 4
        assert r["hook"] == [16, 16, 8, 6, 4, 4]


def test_local_update_compensation_by_hand(runs):
    results = scenario(runs, "compensation")
    # w0 = 1, gradient a_r * w (a = 1, 3: mean 2), lr 0.25, eta_local 0.5
    for rank, r in enumerate(results):
        assert r["plain"]["w"] == [0.5, 0.25, 0.125]  # w_{t+1} = w_t - 0.25 * 2 w_t
        # delayed: g_{t+1} at w_t; step() of t+1 applies w_{t+1} = w_t - 0.25 * mean(g_t); the first applies nothing
        assert r["delayed"]["w"] == [1.0, 0.5, 0.0, -0.25]
        assert r["delayed"]["local_grads"] == [[1, 1, 0.5], [3, 3, 1.5]][rank]
        # compensated: g_{t+1} at w_t - 0.5 g_t^r; then back to w_t and w_{t+1} = w_t - 0.25 * mean(g_t)
        assert r["compensated"]["local_grads"] == [[1, 0.5, 0.25], [3, -1.5, 3.75]][rank]
        assert r["compensated"]["w"] == [[0.5, 0.25, 0.5, 0.125], [-0.5, 1.25, -1.25, 0.125]][rank]


def test_full_precision_steps_keep_the_residuals_and_compressed_ones_are_local_engines(runs):
    results = scenario(runs, "full_steps")
    plan = casync.SyncPlan.from_dict(results[0]["plan"])
    engine = casync.LocalEngine(plan)
    engine.load_state_dict({"version": 1, "step": 3, "workers": 2, "residuals": {}})
    want = {step: engine.sync(step_grads(2, step)) for step in (3, 4)}  # steps 0-2 left no residuals
    for rank, r in enumerate(results):
        assert r["full"] == [True, True, True, False, False, True]  # start_iter=2, full_sync_every=3
        for step in (0, 1, 2, 5):
            exact = {n: (step_grads(2, step)[0][n] + step_grads(2, step)[1][n]) / 2 for n in SHAPES}
            for name in SHAPES:
                np.testing.assert_allclose(r["grads"][step][name], exact[name], rtol=1e-6, atol=1e-7)
        for step in (3, 4):
            for name in SHAPES:
                assert np.array_equal(r["grads"][step][name], want[step][rank][name]), (step, name)
        assert r["residuals"][2] == {}  # nothing compressed yet
        for role, params in r["residuals"][4].items():  # the full step 5 kept step 4's residuals
            for name, value in params.items():
                assert np.array_equal(r["residuals"][5][role][name], value) and np.any(value), (role, name)


def test_optimizer_resumes_bit_for_bit_mid_warmup_and_with_a_delayed_update_in_flight(runs):
    results = scenario(runs, "resume_optimizer")
    for r in results:
        assert r["dgc"]["iteration"] == 3 and r["cdsgd"]["pending"] == 2
        for mode in ("dgc", "cdsgd"):
            for name, value in r[mode]["straight"].items():
                assert np.array_equal(r[mode]["resumed"][name], value), (mode, name)
                assert np.array_equal(value, results[0][mode]["straight"][name]), (mode, name)  # replicas agree


def test_hook_resumes_bit_for_bit_mid_warmup_with_every_dgc_keeper(runs):
    results = scenario(runs, "resume_hook")
    for r in results:
        assert r["iteration"] == 4 and r["sent"] > 0 and r["unmasked"] == 0  # u = 0 wherever something was sent
        for name, value in r["straight"].items():
            assert np.array_equal(r["resumed"][name], value), name
            assert np.array_equal(value, results[0]["straight"][name]), name


def test_refusals_that_need_the_process_group(runs):
    for r in scenario(runs, "refusals"):
        assert "momentum_masking needs sparse codecs" in r["dense"]
        assert "the SGD optimizing the DDP model has momentum of its own (momentum=0.9" in r["hook_momentum"]
        assert "between backward and step(): call it after step()" in r["mid_step"]
        assert r["after_step"] == ["casync", "delayed", "optimizer"]
