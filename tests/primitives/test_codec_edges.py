"""Regression tests for edge cases of the codec library: extreme magnitudes, strided buffers, subclassing,
malformed side channels."""
from __future__ import annotations

import numpy as np
import pytest

from casync.primitives.codecs import get_codec
from casync.primitives.codecs.base import norms
from casync.primitives.codecs.dense import NoneCodec, cast
from casync.primitives.finite import NF_INDEX, NF_VALUE, restore, split_nonfinite
from casync.primitives.ops import run_encode, run_node


@pytest.mark.parametrize("big", [3e19, 1e37])
def test_norms_do_not_overflow_for_finite_inputs(big):
    x = np.array([big, -1.0, 2.0, 0.5] * 32, np.float32)
    l1, l2 = norms(x)
    x64 = x.astype(np.float64)
    assert l1 == pytest.approx(np.abs(x64).sum(), rel=1e-6)
    assert l2 == pytest.approx(np.dot(x64, x64), rel=1e-6)


def test_norms_of_tiny_inputs_are_not_flushed_to_zero():
    x = np.full(8, 1e-24, np.float32)
    l1, l2 = norms(x)
    assert l2 == pytest.approx(8 * np.float64(x[0]) ** 2, rel=1e-6) and l2 / l1 > 0


def test_norms_of_ordinary_inputs_are_unchanged():
    """The float64 fallback is taken only where float32 blocks over- or underflow: otherwise the blocked sums."""
    from casync.primitives.codecs.base import CHUNK, block_sum

    x = np.random.default_rng(0).standard_normal(CHUNK + 12_345).astype(np.float32)
    l1 = sum(float(block_sum(np.abs(x[s:s + CHUNK]))) for s in range(0, x.size, CHUNK))
    l2 = sum(float(block_sum(x[s:s + CHUNK] * x[s:s + CHUNK])) for s in range(0, x.size, CHUNK))
    assert norms(x) == (l1, l2)


def test_terngrad_contractive_scale_is_finite_for_a_large_finite_gradient():
    """A finite value above ~1.8e19 squared to inf in float32: the scale became inf, and error feedback then kept
    a residual of -inf that silenced the worker's whole partition for good."""
    c = get_codec("terngrad")
    x = np.array([3e19, 1.0, -2.0, 0.5], np.float32)
    payload = c.encode_contractive(x, 0)
    assert np.isfinite(payload["scale"]).all()
    residuals: dict[str, np.ndarray] = {}
    for step in range(3):
        run_encode(c, x, step, residuals, "k")
        assert np.isfinite(residuals["k"]).all()


def test_fp16_fused_paths_accept_negative_strides_with_torch_loaded():
    pytest.importorskip("torch")
    c = get_codec("fp16")
    base = np.random.default_rng(1).standard_normal(40_000).astype(np.float32)
    want = base[::-1] - c.decode(c.encode(base[::-1], 0), base.size)
    x = base.copy()[::-1]
    c.encode_keep_error(x, 0)
    assert x.tobytes() == want.tobytes()
    payload = c.encode(base, 0)
    out = np.empty(base.size, np.float32)[::-1]
    c.decode_into(payload, base.size, out)
    assert out.tobytes() == c.decode(payload, base.size).tobytes()
    assert cast(base[::-1], np.empty(base.size, np.float16)).tobytes() == base[::-1].astype(np.float16).tobytes()


def test_a_subclass_overriding_decode_is_decoded_with_it_everywhere():
    class Doubled(NoneCodec):
        name = "doubled-test"

        def decode(self, payload, n):
            return super().decode(payload, n) * 2

    c = Doubled()
    payload = c.encode(np.ones(4, np.float32))
    assert (c.decode_shared(payload, 4) == 2).all()
    assert (c.decode_into(payload, 4, np.empty(4, np.float32)) == 2).all()
    attrs = {"op": "decode", "codec": "d", "numel": 4, "bucket": "b", "part": 0}
    got = run_node(attrs, [payload], None, codecs={"d": c}, residuals=None, plan_seed=0, step=0)
    assert (got == 2).all()


@pytest.mark.parametrize("index", [[0, -2, 3], [0, 9, 3], [3, 3], [0.0, 1.0]])
def test_restore_rejects_a_malformed_side_channel(index):
    payload = {NF_INDEX: np.array(index), NF_VALUE: np.full(len(index), np.nan, np.float32)}
    with pytest.raises(ValueError, match="malformed non-finite side channel"):
        restore(np.zeros(6, np.float32), payload)


def test_restore_accepts_what_split_nonfinite_makes():
    x = np.arange(6, dtype=np.float32)
    x[[1, 4]] = [np.nan, -np.inf]
    _, index, values = split_nonfinite(x)
    got = restore(np.zeros(6, np.float32), {NF_INDEX: index, NF_VALUE: values})
    assert np.isnan(got[1]) and got[4] == -np.inf and (got[[0, 2, 3, 5]] == 0).all()


@pytest.mark.parametrize("strategy", ["allgather", "ring", "ps"])
def test_an_fp16_overflow_goes_as_inf_once_and_does_not_poison_later_steps(strategy):
    """A finite gradient beyond ±65504 travels as ±inf, as with PyTorch's fp16 hook (a GradScaler skips that
    step); its error-feedback residual is 0, not ∓inf, so the next steps are finite and exact again (they were
    -inf, then NaN forever)."""
    import casync

    plan = casync.build_plan({"w": (40_000,)}, workers=2, strategy=strategy, codec="fp16")
    assert all(b.uses_error_feedback for b in plan.buckets)
    engine = casync.LocalEngine(plan)
    rng = np.random.default_rng(0)
    spike = [rng.standard_normal(40_000).astype(np.float32) for _ in range(2)]
    spike[0][123] = 1e5
    out = engine.sync([{"w": g} for g in spike])
    assert out[0]["w"][123] == out[1]["w"][123]
    if strategy != "ps":  # co-located PS: the value's own server merges it raw, and the mean (50,000) fits fp16
        assert np.isposinf(out[0]["w"][123])
    assert all(np.isfinite(r).all() for r in engine.state.residuals.values())
    for step in range(3):
        grads = [rng.standard_normal(40_000).astype(np.float32) for _ in range(2)]
        out = engine.sync([{"w": g} for g in grads])
        exact = (grads[0].astype(np.float64) + grads[1]) / 2
        for w in range(2):
            assert np.isfinite(out[w]["w"]).all(), (step, w)
            if step:  # (PS's server re-encoded the finite mean 50,000 and carries its rounding into step 0)
                np.testing.assert_allclose(out[w]["w"], exact, atol=2e-2)
