"""Tests of the codec library: the shared contract for every registered codec,
each codec's error bound, and the registry (including adding a codec)."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from casync.primitives.codecs import (
    Codec,
    Payload,
    available_codecs,
    get_codec,
    parse_spec,
    payload_nbytes,
    register_codec,
    sparse,
    unregister_codec,
)
from casync.primitives.codecs.base import CHUNK, field
from tests.primitives.test_grace_codecs import CHECKS as GRACE_CHECKS

# -- what is tested ------------------------------------------------------------

#: Parameters for the registered codecs that take some; the rest use defaults.
SPECS = {"topk": "topk:ratio=0.1", "randomk": "randomk:ratio=0.1", "tbq": "tbq:threshold=0.5"}
#: Extra settings that take other code paths (int16 levels, k == n, dense random-k, ...).
EXTRA = ["qsgd:levels=1", "qsgd:levels=1000", "topk:ratio=1", "topk:ratio=0.003", "randomk:ratio=0.5"]
CODECS = [get_codec(SPECS.get(name, name)) for name in available_codecs()] + [get_codec(s) for s in EXTRA]
RANDOMIZED = {"terngrad", "qsgd", "randomk", "natural", "dithering"}

codec_param = pytest.mark.parametrize("codec", CODECS, ids=str)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: Finite float32 arrays of moderate magnitude (subnormals excluded: below float32
#: precision no codec can meet a relative bound).
arrays = hnp.arrays(
    np.float32,
    st.integers(0, 300),
    elements=st.floats(-1e4, 1e4, width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False),
)
#: Arrays with many exact ties and zeros (small integers).
tied_arrays = hnp.arrays(np.float32, st.integers(0, 300), elements=st.integers(-3, 3).map(float))

SIZES = [0, 1, 2, 3, 5, 7, 8, 9, 13, 61, 127, 251, 1021, 65_537, CHUNK + 11]


def gaussian(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


def payload_bytes(p: Payload) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    return [(k, a.dtype.str, a.shape, a.tobytes()) for k, a in sorted(p.items())]


def test_every_registered_codec_is_covered():
    assert {c.name for c in CODECS} == set(available_codecs())
    assert {"none", "fp16", "onebit", "terngrad", "tbq", "qsgd", "topk", "randomk"} <= set(available_codecs())


# -- the contract, for every codec ----------------------------------------------


def check_round_trip(codec: Codec, x: np.ndarray, seed: int = 1) -> tuple[Payload, np.ndarray]:
    """Encode and decode ``x``, asserting everything the contract promises."""
    n = x.size
    before = x.copy()
    payload = codec.encode(x, seed=seed)
    assert isinstance(payload, dict) and payload
    assert all(isinstance(k, str) and type(v) is np.ndarray for k, v in payload.items())
    assert payload_nbytes(payload) == codec.compressed_nbytes(n)
    y = codec.decode(payload, n)
    assert type(y) is np.ndarray and y.dtype == np.float32 and y.shape == (n,)
    assert y.flags.writeable and y.flags.c_contiguous
    assert not np.shares_memory(y, x)
    assert not any(np.shares_memory(y, a) for a in payload.values())
    np.testing.assert_array_equal(x, before)  # input untouched (bitwise, -0.0 included)
    assert x.tobytes() == before.tobytes()
    check_error(codec, x, payload, y)
    return payload, y


@codec_param
@pytest.mark.parametrize("n", SIZES)
def test_round_trip_sizes(codec, n):
    check_round_trip(codec, gaussian(n, seed=n))


@codec_param
@SETTINGS
@given(x=arrays)
@example(x=np.array([64.0] + [0.02] * 128, np.float32))  # float32 sums losing digits beside one large term
@example(x=np.array([4096.0] + [1.0] * 127, np.float32))  # 4096^2 = 2^24: + 1.0 is lost in a float32 row sum
def test_round_trip_hypothesis(codec, x):
    check_round_trip(codec, x)


@codec_param
@SETTINGS
@given(x=tied_arrays)
def test_round_trip_ties_and_zeros(codec, x):
    check_round_trip(codec, x)


@codec_param
def test_special_inputs(codec):
    specials = np.array([0.0, -0.0, 1e-40, -1e-40, 1e-30, 3.0e38, -3.0e38, 1.0, -1.0] * 3, np.float32)
    if codec.name == "qsgd":  # its norm would overflow float32: refused with a clear error
        with pytest.raises(ValueError, match="qsgd"):
            codec.encode(specials)
        specials = specials[np.abs(specials) < 1e38]
    payload = codec.encode(specials, seed=3)
    y = codec.decode(payload, specials.size)
    assert y.shape == specials.shape and y.dtype == np.float32
    assert payload_nbytes(payload) == codec.compressed_nbytes(specials.size)


@codec_param
def test_non_contiguous_input_is_accepted(codec):
    x = gaussian(201)[::3]
    y1 = codec.decode(codec.encode(x, seed=2), x.size)
    y2 = codec.decode(codec.encode(x.copy(), seed=2), x.size)
    np.testing.assert_array_equal(y1, y2)


@codec_param
@pytest.mark.parametrize("n", [0, 1, 7, 1000, 100_000])
@pytest.mark.parametrize("strided", [False, True])
def test_encode_keep_error_leaves_exactly_the_unsent_remainder(codec, n, strided):
    """Error feedback's fast path: the same payload as encode, and x becomes x - decode(payload) bit for bit."""
    base = gaussian(3 * n if strided else n, seed=n)
    base[:5] = [0.0, -0.0, 1e-40, -3.0, 3.0][: base.size]
    x = base[::3] if strided else base
    expected_payload = codec.encode(x.copy(), seed=9)
    expected = x - codec.decode(expected_payload, x.size)
    payload = codec.encode_keep_error(x, seed=9)
    assert payload.keys() == expected_payload.keys()
    for key in payload:
        np.testing.assert_array_equal(payload[key], expected_payload[key])
    assert x.tobytes() == expected.tobytes()


@codec_param
@pytest.mark.parametrize("n", [0, 1, 1001, 600_001])
def test_decode_into_writes_decode_into_the_slice_it_is_given(codec, n):
    """Engines decode an output partition straight into its slice of the result buffer: the same floats as
    decode, and nothing outside the slice touched."""
    x = gaussian(n, seed=n)
    payload = codec.encode(x, seed=5)
    result = np.full(n + 7, np.float32(7.5))
    got = codec.decode_into(payload, n, result[3 : 3 + n])
    assert np.shares_memory(got, result) or n == 0
    assert result[3 : 3 + n].tobytes() == codec.decode(payload, n).tobytes()
    assert (result[:3] == 7.5).all() and (result[3 + n:] == 7.5).all()


@codec_param
@pytest.mark.parametrize("n", [0, 1, 1000, 600_001])
def test_encode_feedback_is_encode_keep_error_of_the_sum(codec, n):
    """One error-feedback step, fused or not: the payload of x + residual, and the new residual bit for bit
    (600,001 floats: several of the fused sweeps' blocks and a ragged end)."""
    x, residual = gaussian(n, seed=n), gaussian(n, seed=n + 1) * 0.1
    x[:4] = [0.0, -0.0, 1e-40, -3.0][: x.size]
    expected_remainder = x + residual
    expected_payload = codec.encode_keep_error(expected_remainder, seed=4)
    payload, remainder = codec.encode_feedback(x.copy(), residual.copy(), seed=4)
    assert payload.keys() == expected_payload.keys()
    for key in payload:
        np.testing.assert_array_equal(payload[key], expected_payload[key])
    assert remainder.tobytes() == expected_remainder.tobytes()


@codec_param
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 5000))
def test_compressed_nbytes_matches_payload(codec, n):
    payload = codec.encode(gaussian(n, seed=n), seed=n)
    assert payload_nbytes(payload) == codec.compressed_nbytes(n)


def test_compressed_nbytes_formulas():
    n = 1000
    assert get_codec("none").compressed_nbytes(n) == 4000
    assert get_codec("fp16").compressed_nbytes(n) == 2000
    assert get_codec("onebit").compressed_nbytes(1001) == 126 + 4
    assert get_codec("terngrad").compressed_nbytes(1001) == 251 + 4
    assert get_codec("tbq").compressed_nbytes(1001) == 251 + 4
    assert get_codec("qsgd").compressed_nbytes(n) == 1004
    assert get_codec("qsgd:levels=128").compressed_nbytes(n) == 2004
    assert get_codec("topk:ratio=0.01").compressed_nbytes(n) == 10 * 8
    assert get_codec("randomk:ratio=0.01").compressed_nbytes(n) == 8 + 10 * 4
    big = 2**32  # indices no longer fit uint32
    assert get_codec("topk:ratio=0.01").compressed_nbytes(big) == sparse.sparse_k(0.01, big) * 12
    assert get_codec("topk:ratio=0.01").compressed_nbytes(big - 1) == sparse.sparse_k(0.01, big - 1) * 8
    for c in CODECS:
        assert c.compressed_nbytes(0) == payload_nbytes(c.encode(np.zeros(0, np.float32)))
    assert get_codec("onebit").compression_ratio(1024) == 4096 / (128 + 4)
    assert get_codec("none").compression_ratio(0) == float("inf")


@codec_param
def test_same_seed_same_payload(codec):
    x = gaussian(5003, seed=7)
    a, b = codec.encode(x, seed=42), codec.encode(x.copy(), seed=42)
    assert payload_bytes(a) == payload_bytes(b)


@codec_param
def test_different_seeds(codec):
    x = gaussian(5003, seed=7)
    a, b = codec.encode(x, seed=1), codec.encode(x, seed=2)
    if codec.name in RANDOMIZED and not (codec.name == "randomk" and codec.k(x.size) == x.size):
        assert payload_bytes(a) != payload_bytes(b)
    else:  # deterministic codecs (top-k included: the seed only steers its sampling)
        assert payload_bytes(a) == payload_bytes(b)


@codec_param
def test_a_codec_that_ignores_the_seed_encodes_alike_for_every_seed(codec):
    """``ignores_seed`` lets the engines pass 0 instead of deriving a seed per encode: sound only where no encode
    path draws from it (plain, keeping the error, with error feedback)."""
    if not codec.ignores_seed:
        assert codec.name in RANDOMIZED or codec.name == "topk"  # the seed steers top-k's sampling
        return
    assert codec.name not in RANDOMIZED
    x, residual = gaussian(70_001, seed=3), gaussian(70_001, seed=4) * 0.1
    for seed in (1, 2**63 + 5):
        assert payload_bytes(codec.encode(x, seed)) == payload_bytes(codec.encode(x, 0))
        kept, kept0 = x.copy(), x.copy()
        assert payload_bytes(codec.encode_keep_error(kept, seed)) == payload_bytes(codec.encode_keep_error(kept0, 0))
        np.testing.assert_array_equal(kept.view(np.uint32), kept0.view(np.uint32))
        (p, r), (p0, r0) = codec.encode_feedback(x, residual, seed), codec.encode_feedback(x, residual, 0)
        assert payload_bytes(p) == payload_bytes(p0)
        np.testing.assert_array_equal(np.asarray(r).view(np.uint32), np.asarray(r0).view(np.uint32))


def test_a_subclass_encoding_its_own_way_does_not_inherit_ignores_seed():
    onebit = type(get_codec("onebit"))
    assert onebit.ignores_seed

    class Dithered(onebit):
        name = "dithered-onebit"

        def encode(self, x, seed=0):
            return super().encode(x + np.random.default_rng(seed).standard_normal(x.size, np.float32) * 1e-3)

    class Renamed(onebit):
        name = "renamed-onebit"

    assert not Dithered.ignores_seed and Renamed.ignores_seed


@codec_param
def test_concurrent_threads_match_sequential(codec):
    xs = [gaussian(150_000 + i, seed=i) for i in range(4)]
    expected = [payload_bytes(codec.encode(x, seed=i)) for i, x in enumerate(xs)]
    got: list[Any] = [None] * len(xs)

    def work(i: int) -> None:
        got[i] = payload_bytes(codec.encode(xs[i], seed=i))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected


@codec_param
def test_bad_inputs(codec):
    with pytest.raises(TypeError):
        codec.encode(np.zeros(4, np.float64))
    with pytest.raises(TypeError):
        codec.encode([1.0, 2.0])
    with pytest.raises(ValueError):
        codec.encode(np.zeros((2, 2), np.float32))
    payload = codec.encode(gaussian(40), seed=0)
    with pytest.raises(ValueError):
        codec.decode(payload, -1)
    with pytest.raises(ValueError, match=codec.name):
        codec.decode({}, 40)
    if codec.compressed_nbytes(41) != codec.compressed_nbytes(40):
        with pytest.raises(ValueError, match=codec.name):
            codec.decode(payload, 41)  # payload arrays have the wrong shape for n


@pytest.mark.parametrize("name", sorted(RANDOMIZED))
def test_bad_seed(name):
    codec = get_codec(SPECS.get(name, name))
    with pytest.raises(ValueError):
        codec.encode(gaussian(10), seed=-1)
    with pytest.raises(TypeError):
        codec.encode(gaussian(10), seed=1.5)


# -- per-codec error bounds --------------------------------------------------------


def check_error(codec: Codec, x: np.ndarray, payload: Payload, y: np.ndarray) -> None:
    CHECKS[codec.name](codec, x, payload, y)


def check_none(codec, x, payload, y):
    assert codec.lossless and not codec.sparse
    assert y.tobytes() == x.tobytes()


def check_fp16(codec, x, payload, y):
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))
    normal = (np.abs(x) >= np.finfo(np.float16).tiny) & (np.abs(x) <= np.finfo(np.float16).max)
    rel = np.abs(y[normal] - x[normal]) / np.abs(x[normal])
    assert (rel <= 2.0**-11).all()
    big = np.abs(x) > 65520  # rounds past the largest half: overflow to inf, like torch
    assert (np.isinf(y[big]) & (np.sign(y[big]) == np.sign(x[big]))).all()


def check_onebit(codec, x, payload, y):
    s = payload["scale"][0]
    mean_abs = np.abs(x.astype(np.float64)).mean() if x.size else 0.0
    # the scale sums |x| in float32: n terms (all >= 0) carry at most n * eps of relative error, and a few of
    # them beside a large one lose digits (hypothesis found 64 and 118 x 0.02: 3.1e-6)
    assert np.isclose(s, mean_abs, rtol=max(1e-6, x.size * float(np.finfo(np.float32).eps)), atol=0)
    np.testing.assert_array_equal(payload["bits"], np.packbits(x < 0))
    np.testing.assert_array_equal(y, np.where(x < 0, -s, s).astype(np.float32))


def check_terngrad(codec, x, payload, y):
    s = payload["scale"][0]
    assert s == (np.abs(x).max() if x.size else 0)
    assert np.isin(y, [-s, 0, s]).all()
    assert (y[x == 0] == 0).all()
    nz = y != 0
    assert (np.sign(y[nz]) == np.sign(x[nz])).all()
    assert (y[np.abs(x) == s] == x[np.abs(x) == s]).all()  # probability 1


def check_tbq(codec, x, payload, y):
    tau = np.float32(codec.threshold)
    assert payload["threshold"][0] == tau
    expected = np.where(x > tau, tau, np.where(x < -tau, -tau, 0)).astype(np.float32)
    np.testing.assert_array_equal(y, expected)


def check_qsgd(codec, x, payload, y):
    s = codec.levels
    norm = payload["norm"][0]
    assert np.isclose(norm, np.linalg.norm(x.astype(np.float64)), rtol=1e-6)
    levels = payload["levels"]
    assert levels.dtype == (np.int8 if s <= 127 else np.int16)
    assert (np.abs(levels.astype(np.int32)) <= s).all()
    assert ((levels == 0) | (np.sign(levels) == np.sign(x))).all()
    slack = 1e-5 * norm / s + 1e-6 * np.abs(x)  # float32 rounding of the products
    assert (np.abs(y - x) <= norm / s + slack).all()


def check_topk(codec, x, payload, y):
    n, k = x.size, codec.k(x.size)
    idx = payload["indices"]
    assert idx.dtype == np.uint32 and idx.shape == (k,)
    assert (np.diff(idx.astype(np.int64)) > 0).all()  # ascending, distinct
    np.testing.assert_array_equal(payload["values"], x[idx])
    dropped = np.ones(n, bool)
    dropped[idx] = False
    np.testing.assert_array_equal(y[idx], x[idx])
    assert (y[dropped] == 0).all()
    if 0 < k < n:
        assert np.abs(x[idx]).min() >= np.abs(x[dropped]).max()
    # The full sort: ties at the k-th magnitude go to the lower index.
    reference = np.sort(np.argsort(-np.abs(x), kind="stable")[:k])
    np.testing.assert_array_equal(idx, reference)


def check_randomk(codec, x, payload, y):
    n, k = x.size, codec.k(x.size)
    seed = int(payload["seed"][0])
    idx = sparse.random_indices(n, k, seed)
    assert idx.shape == (k,) and (np.diff(idx.astype(np.int64)) > 0).all()
    assert k == 0 or (idx[0] >= 0 and idx[-1] < n)
    np.testing.assert_array_equal(payload["values"], x[idx])
    expected = np.zeros(n, np.float32)
    expected[idx] = x[idx]
    np.testing.assert_array_equal(y, expected)


CHECKS = {
    "none": check_none,
    "fp16": check_fp16,
    "onebit": check_onebit,
    "terngrad": check_terngrad,
    "tbq": check_tbq,
    "qsgd": check_qsgd,
    "topk": check_topk,
    "randomk": check_randomk,
    **GRACE_CHECKS,  # GRACE's compressors and BytePS's dithering
}


def test_fp16_overflow_and_rounding():
    c = get_codec("fp16")
    x = np.array([65504, 65519, 65520, 1e6, -1e6, 1 + 2**-11, 1 + 3 * 2**-11, 1e-8], np.float32)
    y = c.decode(c.encode(x), x.size)
    np.testing.assert_array_equal(y, [65504, 65504, np.inf, np.inf, -np.inf, 1, 1 + 2**-9, 0])


def test_onebit_decodes_to_plus_minus_mean_abs():
    x = np.array([-2, 0, 1, -0.0, 3, -4, 5, 6, 7], np.float32)
    y = get_codec("onebit").decode(get_codec("onebit").encode(x), x.size)
    s = np.float32(np.abs(x).mean())
    np.testing.assert_array_equal(y, [-s, s, s, s, s, -s, s, s, s])


def mean_decoded(codec: Codec, x: np.ndarray, trials: int) -> np.ndarray:
    return np.mean([codec.decode(codec.encode(x, seed=i), x.size) for i in range(trials)], axis=0)


def test_terngrad_is_unbiased():
    x = gaussian(64, seed=3)
    trials = 3000
    s = np.abs(x).max()
    # Each output is s * Bernoulli: sd <= s / 2, so the mean's sd <= s / (2 sqrt(trials)).
    err = np.abs(mean_decoded(get_codec("terngrad"), x, trials) - x)
    assert (err <= 6 * s / (2 * np.sqrt(trials))).all()
    # ... and the test can tell a biased codec apart: deterministic sign * s is off by far more.
    assert np.abs(np.sign(x) * s - x).max() > 20 * s / (2 * np.sqrt(trials))


def test_qsgd_is_unbiased():
    x = gaussian(64, seed=4)
    trials = 3000
    codec = get_codec("qsgd:levels=2")
    step = np.linalg.norm(x) / 2  # each output is off by at most one step
    err = np.abs(mean_decoded(codec, x, trials) - x)
    assert (err <= 6 * step / (2 * np.sqrt(trials))).all()


@pytest.mark.parametrize("tau", [1e-3, 0.5, 2.0])
def test_tbq_threshold_boundaries(tau):
    c = get_codec(("tbq", {"threshold": tau}))
    t = np.float32(tau)
    above = np.nextafter(t, np.float32(np.inf))
    x = np.array([t, -t, above, -above, 0, 10 * t, -10 * t], np.float32)
    y = c.decode(c.encode(x), x.size)
    np.testing.assert_array_equal(y, [0, 0, t, -t, 0, t, -t])


def test_tbq_default_threshold():
    assert get_codec("tbq").threshold == 0.5


# -- top-k internals: the sampled threshold, its retries and the mask scan ---------------


@pytest.mark.parametrize(
    "kind", ["gaussian", "sorted", "constant", "mostly_zero", "spikes_at_end", "heavy_ties"]
)
@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.1])
def test_topk_large_inputs_match_full_sort(kind, ratio):
    n = 100_003
    rng = np.random.default_rng(5)
    x = {
        "gaussian": lambda: rng.standard_normal(n, dtype=np.float32),
        "sorted": lambda: np.sort(rng.standard_normal(n, dtype=np.float32)),
        "constant": lambda: np.full(n, -0.25, np.float32),
        "mostly_zero": lambda: np.where(rng.random(n) < 0.002, rng.standard_normal(n), 0).astype(np.float32),
        "spikes_at_end": lambda: np.concatenate([np.ones(n - 2000), 1 + rng.random(2000)]).astype(np.float32),
        "heavy_ties": lambda: rng.integers(-5, 6, n).astype(np.float32),
    }[kind]()
    check_round_trip(get_codec(("topk", {"ratio": ratio})), x, seed=9)


@pytest.mark.parametrize("nonzeros", [0, 10, 1500, 5000])
def test_topk_mostly_zeros(nonzeros):
    n, k = 300_007, 3001
    x = np.zeros(n, np.float32)
    x[np.random.default_rng(1).choice(n, nonzeros, replace=False)] = 1 + np.arange(nonzeros, dtype=np.float32)
    x[::7] *= -1  # -0.0 ties with 0.0
    idx, vals = sparse.topk(x, k, seed=0)
    reference = np.sort(np.argsort(-np.abs(x), kind="stable")[:k])
    np.testing.assert_array_equal(idx, reference)
    np.testing.assert_array_equal(vals, x[reference])


def test_topk_falls_back_when_the_sample_misleads(monkeypatch):
    x = gaussian(200_000, seed=1)
    k = 2000
    reference = np.sort(np.argsort(-np.abs(x), kind="stable")[:k])
    calls = []

    def too_high(x, k, seed):
        calls.append(1)
        return [np.float32(10.0), np.float32(5.0)]  # nothing that large: too few candidates

    monkeypatch.setattr(sparse, "_sample_thresholds", too_high)
    idx, vals = sparse.topk(x, k, seed=0)
    assert calls
    np.testing.assert_array_equal(idx, reference)
    np.testing.assert_array_equal(vals, x[reference])


def test_topk_estimated_threshold_usually_suffices():
    x = gaussian(500_000, seed=2)
    k = 5000
    kth = np.sort(np.abs(x))[-k]
    for seed in range(5):
        t = sparse._sample_thresholds(x, k, seed)[0]
        assert t <= kth  # the first estimate already keeps enough candidates ...
        assert np.count_nonzero(np.abs(x) >= t) < 2 * k  # ... and not too many


@settings(max_examples=60, deadline=None)
@given(x=arrays, q=st.floats(0, 1))
def test_at_least_matches_flatnonzero(x, q):
    t = np.float32(np.quantile(np.abs(x), q)) if x.size else np.float32(1)
    idx, vals = sparse.at_least(x, t)
    expected = np.flatnonzero(np.abs(x) >= t)
    np.testing.assert_array_equal(idx, expected)
    np.testing.assert_array_equal(vals, x[expected])


@pytest.mark.parametrize("density", [0.0, 0.001, 0.01, 0.05, 0.3, 1.0])
def test_at_least_across_densities_and_blocks(density):
    n = CHUNK + 77  # two blocks, the second one ragged
    rng = np.random.default_rng(8)
    x = np.where(rng.random(n) < density, 2 + rng.random(n), rng.random(n)).astype(np.float32)
    idx, vals = sparse.at_least(x, np.float32(2))
    np.testing.assert_array_equal(idx, np.flatnonzero(x >= 2))
    np.testing.assert_array_equal(vals, x[idx])


@pytest.mark.parametrize(
    "ratio,n,k",
    [
        (0.01, 0, 0), (0.01, 1, 1), (0.01, 100, 1), (0.01, 101, 2),
        (0.07, 100, 7), (0.5, 3, 2), (1.0, 9, 9), (0.001, 10**6, 1000),
    ],
)
def test_sparse_k(ratio, n, k):
    assert sparse.sparse_k(ratio, n) == k
    assert get_codec(("topk", {"ratio": ratio})).k(n) == k
    assert get_codec(("randomk", {"ratio": ratio})).k(n) == k


# -- random-k internals ------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(10, 3), (1000, 10), (1000, 400), (1000, 999), (100_000, 1000)])
def test_random_indices_distinct_sorted_seeded(n, k):
    a = sparse.random_indices(n, k, seed=5)
    assert a.shape == (k,) and len(np.unique(a)) == k
    assert (np.diff(a.astype(np.int64)) > 0).all() and a[0] >= 0 and a[-1] < n
    np.testing.assert_array_equal(a, sparse.random_indices(n, k, seed=5))
    assert not np.array_equal(a, sparse.random_indices(n, k, seed=6))


@pytest.mark.parametrize("n,k", [(1000, 240), (100_000, 10_000), (1_600_000, 16_000)])
def test_random_indices_are_the_distinct_values_of_the_seeded_draws(n, k):
    """The sparse draw: batches of i.i.d. draws topped up until k distinct values (what a payload's seed
    means to every decoder, on every version that keeps it): checked against that definition written plainly."""
    for seed in range(30):
        rng = np.random.default_rng(seed)
        drawn = np.unique(rng.integers(0, n, size=k, dtype=np.uint32))
        while drawn.size < k:
            drawn = np.unique(np.concatenate([drawn, rng.integers(0, n, size=k - drawn.size, dtype=np.uint32)]))
        np.testing.assert_array_equal(sparse.random_indices(n, k, seed), drawn)


@pytest.mark.parametrize("size", [0, 1, 2, 1000, sparse.RADIX_MAX, sparse.RADIX_MAX + 1])
@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_draws_are_sorted_like_np_sort_on_both_paths(size, dtype):
    """The radix path (uint32, up to RADIX_MAX draws) and the comparison sort give np.sort's order, high
    halves and duplicates included."""
    rng = np.random.default_rng(size)
    hi = np.iinfo(np.uint32).max if dtype == np.uint32 else 2**40
    draws = rng.integers(0, hi, size=size, dtype=dtype, endpoint=True)
    draws[: size // 3] = draws[size // 3 : 2 * (size // 3)]  # repeats
    expected = np.sort(draws)
    np.testing.assert_array_equal(sparse._sorted(draws.copy()), expected)
    np.testing.assert_array_equal(sparse._sorted_unique(draws.copy()), np.unique(draws))


def test_random_indices_are_drawn_once_shared_read_only_and_bounded(monkeypatch):
    """An actor draws a partition's indices for its encode, its merges and its decodes: the later calls get the
    first call's array, which nobody can change; the cache keeps at most INDEX_CACHE_BYTES, least recent out."""
    monkeypatch.setattr(sparse, "_index_cache", sparse._IndexCache())
    n, k = 100_000, 1000
    a = sparse.random_indices(n, k, seed=11)
    assert sparse.random_indices(n, k, seed=11) is a
    np.testing.assert_array_equal(a, sparse._draw_indices(n, k, 11))
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1
    monkeypatch.setattr(sparse, "INDEX_CACHE_BYTES", 2 * a.nbytes)  # room for two
    b, c = sparse.random_indices(n, k, seed=12), sparse.random_indices(n, k, seed=13)  # a is the least recent
    assert sparse.random_indices(n, k, seed=12) is b and sparse.random_indices(n, k, seed=13) is c
    again = sparse.random_indices(n, k, seed=11)
    assert again is not a and np.array_equal(again, a)  # drawn afresh, the same indices


@pytest.mark.parametrize("n,k", [(20, 4), (20, 12)])  # the sparse and the dense draw
def test_random_indices_are_uniform(n, k):
    trials = 3000
    counts = np.zeros(n)
    for seed in range(trials):
        counts[sparse.random_indices(n, k, seed)] += 1
    expected = trials * k / n
    sd = np.sqrt(trials * (k / n) * (1 - k / n))
    assert (np.abs(counts - expected) < 5 * sd).all()


def test_randomk_decode_needs_only_the_payload():
    c = get_codec("randomk:ratio=0.05")
    x = gaussian(10_000)
    payload = c.encode(x, seed=123)
    assert payload["seed"].dtype == np.uint64 and payload["seed"].tolist() == [123]
    assert np.count_nonzero(c.decode(payload, x.size)) == c.k(x.size)
    big_seed = 2**64 - 1  # the largest seed a uint64 field carries
    idx = sparse.random_indices(x.size, c.k(x.size), big_seed)
    np.testing.assert_array_equal(c.decode(c.encode(x, seed=big_seed), x.size)[idx], x[idx])


# -- registry -------------------------------------------------------------------------


def test_get_codec_forms():
    assert get_codec(None).name == "none" and get_codec("none").name == "none"
    assert get_codec("onebit").name == "onebit"
    c = get_codec("topk:ratio=0.25")
    assert c.params() == {"ratio": 0.25} and c.sparse
    assert get_codec(("qsgd", {"levels": 16})).params() == {"levels": 16}
    assert get_codec(c) is c
    assert get_codec(" tbq : threshold = 2 ").params() == {"threshold": 2.0}
    assert get_codec("topk") == get_codec("topk:ratio=0.01")  # the default ratio


def test_parse_spec_values():
    assert parse_spec("x:a=1,b=0.5,c=true,d=False,e=1e-3,f=word") == (
        "x", {"a": 1, "b": 0.5, "c": True, "d": False, "e": 0.001, "f": "word"})
    assert parse_spec("onebit") == ("onebit", {})


@codec_param
def test_spec_round_trip_and_equality(codec):
    again = get_codec(codec.spec())
    assert again == codec and hash(again) == hash(codec) and again is not codec
    assert get_codec((codec.name, codec.params())) == codec
    assert type(codec)(**codec.params()) == codec
    assert get_codec(str(codec).replace("(", ":").rstrip(")")) == codec
    assert codec != get_codec("fp16" if codec.name != "fp16" else "none")


def test_unknown_codec_names_the_name_and_lists_available():
    with pytest.raises(ValueError) as err:
        get_codec("zstd:level=3")
    msg = str(err.value)
    assert "'zstd'" in msg and all(name in msg for name in available_codecs())


@pytest.mark.parametrize(
    "spec,param",
    [
        ("topk:ratio=0", "ratio"), ("topk:ratio=1.5", "ratio"), ("topk:ratio=-0.1", "ratio"),
        ("topk:ratio=abc", "ratio"), (("topk", {"ratio": True}), "ratio"), ("randomk:ratio=2", "ratio"),
        ("topk:ratio=nan", "ratio"), ("qsgd:levels=0", "levels"), ("qsgd:levels=-3", "levels"),
        ("qsgd:levels=40000", "levels"), ("qsgd:levels=2.5", "levels"), ("tbq:threshold=0", "threshold"),
        ("tbq:threshold=-1", "threshold"), ("tbq:threshold=inf", "threshold"),
        ("tbq:threshold=1e-50", "threshold"),
        ("topk:k=10", "k"), ("onebit:scale=2", "scale"), ("topk:ratio", "ratio"),
        ("topk:ratio=0.1,ratio=0.2", "ratio"),
    ],
)
def test_bad_params_raise_value_error_naming_codec_and_param(spec, param):
    with pytest.raises(ValueError) as err:
        get_codec(spec)
    name = spec[0] if isinstance(spec, tuple) else spec.split(":")[0]
    assert repr(name) in str(err.value) and param in str(err.value)


@pytest.mark.parametrize(
    "spec", [3, 0.5, ["topk"], {"name": "topk"}, ("topk",), ("topk", "ratio=0.1"), (1, {}), ("topk", {1: 2})]
)
def test_wrong_spec_types_raise_type_error(spec):
    with pytest.raises(TypeError):
        get_codec(spec)


class ScaleCodec(Codec):
    """A toy codec as a user would write one: float32 values times ``factor``."""

    name = "test_scale"
    lossless = True

    def __init__(self, factor: float = 2.0) -> None:
        if not factor > 0:
            raise ValueError(f"codec 'test_scale': parameter 'factor' must be > 0, got {factor!r}")
        self.factor = float(factor)

    def params(self) -> dict[str, Any]:
        return {"factor": self.factor}

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        return {"scaled": x * np.float32(self.factor)}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        return field(payload, "scaled", np.float32, (n,), self.name) / np.float32(self.factor)

    def compressed_nbytes(self, n: int) -> int:
        return 4 * n


@pytest.fixture
def scale_codec():
    register_codec(ScaleCodec)
    yield ScaleCodec
    unregister_codec(ScaleCodec.name)


def test_adding_a_codec(scale_codec):
    assert "test_scale" in available_codecs()
    c = get_codec("test_scale:factor=4")
    assert isinstance(c, scale_codec) and c.params() == {"factor": 4.0}
    assert get_codec(c.spec()) == c
    x = gaussian(100)
    np.testing.assert_array_equal(c.decode(c.encode(x), x.size), x)
    register_codec(scale_codec)  # registering the same class again is harmless
    with pytest.raises(ValueError, match="factor"):
        get_codec("test_scale:factor=-1")
    with pytest.raises(ValueError, match="'test_scale' has no parameter 'ratio'"):
        get_codec("test_scale:ratio=1")


def test_adding_a_codec_as_decorator():
    @register_codec
    class Half(Codec):
        name = "test_half"

        def encode(self, x, seed=0):
            return {"v": x.astype(np.float16)}

        def decode(self, payload, n):
            return payload["v"].astype(np.float32)

        def compressed_nbytes(self, n):
            return 2 * n

    try:
        c = get_codec("test_half")
        assert isinstance(c, Half)
        assert c.decode(c.encode(np.ones(3, np.float32)), 3).tolist() == [1, 1, 1]
    finally:
        unregister_codec("test_half")
    assert "test_half" not in available_codecs()


def test_registry_rejects_bad_registrations(scale_codec):
    class Impostor(ScaleCodec):
        name = "test_scale"

    with pytest.raises(ValueError, match="already registered"):
        register_codec(Impostor)
    with pytest.raises(TypeError):
        register_codec(int)

    class Nameless(ScaleCodec):
        name = ""

    with pytest.raises(ValueError):
        register_codec(Nameless)
    with pytest.raises(ValueError):
        unregister_codec("no_such_codec")
