"""GRACE's fixed-size compressors (and BytePS's dithering) as casync codecs: each one's definition on a small case
worked by hand, the properties ``test_codecs.py``'s contract tests check on every input (``CHECKS``), the
``efsignsgd`` alias shown equal to GRACE's definition, and signSGD's majority vote: exact on PS with dedicated
servers, refused elsewhere naming the strategy."""
from __future__ import annotations

import numpy as np
import pytest

import casync
from casync.errors import PlanError
from casync.primitives.codecs import ALIASES, get_codec, register_codec
from casync.primitives.codecs.natural import LOW
from casync.primitives.codecs.u8bit import EDGES

# -- the properties every input keeps (test_codecs.py's CHECKS, by codec name) -------------------------------------


def check_signsgd(codec, x, payload, y):
    np.testing.assert_array_equal(y, np.where(x >= 0, 1, -1).astype(np.float32))


def check_onebit2(codec, x, payload, y):
    neg = x < 0
    np.testing.assert_array_equal(payload["bits"], np.packbits(neg))
    x64 = x.astype(np.float64)
    want = [x64[neg].mean() if neg.any() else 0.0, x64[~neg].mean() if (~neg).any() else 0.0]
    np.testing.assert_allclose(payload["scales"], want, rtol=1e-6)
    np.testing.assert_array_equal(y, np.where(neg, payload["scales"][0], payload["scales"][1]))


def check_natural(codec, x, payload, y):
    assert (np.signbit(y) == np.signbit(x)).all()
    a, b = np.abs(x.astype(np.float64)), np.abs(y.astype(np.float64))
    normal = (a >= 2.0**-108) & (a < 2.0**18)
    low = np.exp2(np.floor(np.log2(a[normal])))  # the power of two at or below |x|
    assert ((b[normal] == low) | (b[normal] == 2 * low)).all()
    assert (b[normal][a[normal] == low] == low[a[normal] == low]).all()  # a power of two is sent as itself
    assert (b[a >= 2.0**18] == 2.0**18).all()
    assert np.isin(b[a < 2.0**-108], [0.0, 2.0**-108]).all()


def check_u8bit(codec, x, payload, y):
    s = np.float32(np.abs(x).max()) if x.size else np.float32(0)
    assert payload["scale"][0] == s
    r = np.abs(x) / s if s > 0 else np.zeros_like(x)
    bins = np.clip(np.digitize(r, EDGES) - 1, 0, 127)  # the last edge at or below r
    np.testing.assert_array_equal(np.abs(payload["codes"].astype(np.int32)), bins)
    want = np.where(x < 0, -1, 1) * (bins > 0) * (EDGES[bins] * s)
    np.testing.assert_array_equal(y, want.astype(np.float32))


def check_sketch(codec, x, payload, y):
    codes, means = payload["codes"].astype(np.int64), payload["means"]
    order = np.argsort(x, kind="stable")
    assert (np.diff(codes[order]) >= 0).all()  # bins follow the order of the values
    counts = np.bincount(codes, minlength=means.size)
    sums = np.bincount(codes, weights=x.astype(np.float64), minlength=means.size)
    used = counts > 0
    np.testing.assert_allclose(means[used], sums[used] / counts[used], rtol=1e-6, atol=1e-30)
    assert (means[~used] == 0).all()
    np.testing.assert_array_equal(y, means[codes])


def check_dithering(codec, x, payload, y):
    levels, s = payload["levels"].astype(np.int64), payload["scale"][0]
    assert s == (np.abs(x).max() if x.size else 0)
    assert (np.abs(levels) <= codec.top).all() and ((levels == 0) | (np.sign(levels) == np.sign(x))).all()
    if codec.partition == "natural":
        assert np.isin(np.abs(levels), [0] + [1 << j for j in range(codec.levels)]).all()
    else:  # one of the two levels around |x| / s * L
        scaled = np.abs(x.astype(np.float64)) / s * codec.top if s > 0 else np.zeros(x.size)
        assert (np.abs(np.abs(levels) - scaled) <= 1 + 1e-5).all()
    np.testing.assert_array_equal(y, (levels.astype(np.float32) * s / np.float32(codec.top)).astype(np.float32))


CHECKS = {"signsgd": check_signsgd, "onebit2": check_onebit2, "natural": check_natural, "u8bit": check_u8bit,
          "sketch": check_sketch, "dithering": check_dithering}

# -- each definition, on a case worked by hand ------------------------------------------------------------------------


def round_trip(spec: str, x: list[float], seed: int = 0) -> tuple[dict, np.ndarray]:
    codec = get_codec(spec)
    a = np.array(x, np.float32)
    payload = codec.encode(a, seed)
    return payload, codec.decode(payload, a.size)


def test_signsgd_sends_the_sign_of_x_at_least_zero_and_decodes_unscaled():
    payload, y = round_trip("signsgd", [-2.0, 0.0, -0.0, 3.0, -1e-30, 5.0, 6.0, 7.0, -8.0])
    assert payload["bits"].tolist() == [0b10001000, 0b10000000]  # 1 = negative; zero and -0.0 count as positive
    assert y.tolist() == [-1, 1, 1, 1, -1, 1, 1, 1, -1]


def test_onebit2_sends_the_mean_of_each_sign_group():
    payload, y = round_trip("onebit2", [-1.0, -3.0, 2.0, 0.0, 4.0, -0.0])
    assert payload["bits"].tolist() == [0b11000000]
    assert payload["scales"].tolist() == [-2.0, 1.5]  # (-1 - 3) / 2 and (2 + 0 + 4 + 0) / 4
    assert y.tolist() == [-2.0, -2.0, 1.5, 1.5, 1.5, 1.5]
    _, ones = round_trip("onebit", [-1.0, -3.0, 2.0, 0.0, 4.0, -0.0])  # one scale: mean |x| = 10 / 6
    assert np.allclose(ones, np.float32(10 / 6) * np.array([-1, -1, 1, 1, 1, 1]))
    _, empty = round_trip("onebit2", [2.0, 4.0])  # no negative element: its scale is 0
    assert empty.tolist() == [3.0, 3.0]


def test_natural_sends_a_sign_and_an_exponent_per_byte():
    payload, y = round_trip("natural", [1.0, -0.5, 2.0**18, 2.0**20, 0.0, -0.0, 2.0**-120, 2.0**-108])
    # 1.0 has biased exponent 127: code 127 - 18; -0.5: 126 - 18 with the sign bit; 2^20 saturates at 145 - 18
    assert payload["codes"].tolist() == [109, 128 + 108, 127, 127, 0, 128, 0, 1]
    assert y.tolist() == [1.0, -0.5, 2.0**18, 2.0**18, 0.0, -0.0, 0.0, 2.0**-108]
    assert LOW == 18
    # 1.5 = 2^0 * (1 + 1/2): up to 2 with probability 1/2; 1.25 up with 1/4; -3 = -2 * 1.5: -2 or -4
    draws = np.array([round_trip("natural", [1.5, 1.25, -3.0], seed)[1] for seed in range(4000)])
    assert set(draws[:, 0]) == {1.0, 2.0} and set(draws[:, 1]) == {1.0, 2.0} and set(draws[:, 2]) == {-2.0, -4.0}
    np.testing.assert_allclose(draws.mean(0), [1.5, 1.25, -3.0], rtol=0.02)  # unbiased
    np.testing.assert_allclose((draws == [2.0, 2.0, -4.0]).mean(0), [0.5, 0.25, 0.5], atol=0.03)


def test_u8bit_sends_the_signed_bin_of_x_over_its_maximum():
    assert EDGES.size == 128 and EDGES[97] == np.float32(0.49296874) and EDGES[98] == np.float32(0.51015621)
    assert EDGES[127] == np.float32(0.99570298) and EDGES[0] == np.float32(1.5e-6)
    payload, y = round_trip("u8bit", [1.0, -2.0, 0.0, 1e-7, -0.99])
    # s = 2: 1/2 = 0.5 falls in bin 97 ([0.4930, 0.5102)); 2/2 = 1 is past the last edge: bin 127 (GRACE: NaN);
    # 1e-7 / 2 is below the first edge: bin 0, sent as 0; 0.99 / 2 = 0.495: bin 97
    assert payload["scale"].tolist() == [2.0] and payload["codes"].tolist() == [97, -127, 0, 0, -97]
    assert y.tolist() == [np.float32(0.49296874) * 2, -np.float32(0.99570298) * 2, 0.0, 0.0,
                          -np.float32(0.49296874) * 2]


def test_sketch_sends_each_values_quantile_bin_and_the_bins_means():
    payload, y = round_trip("sketch:quantiles=2", [4.0, 1.0, 2.0, 3.0])
    # edges at the 0, 1/2 and 1 quantiles: 1, 2.5, 4; bins [1, 2.5) and [2.5, 4]
    assert payload["codes"].tolist() == [1, 0, 0, 1] and payload["means"].tolist() == [1.5, 3.5]
    assert y.tolist() == [3.5, 1.5, 1.5, 3.5]
    payload, y = round_trip("sketch:quantiles=4", [0.0, 0.0, 0.0, 0.0, 1.0])
    # edges 0, 0, 0, 0, 1: the zeros fall past the equal edges into the last bin, with the 1; bins 0-2 are empty
    assert payload["codes"].tolist() == [3] * 5 and payload["means"].tolist() == [0, 0, 0, np.float32(0.2)]
    wide = get_codec("sketch:quantiles=300")  # uint16 codes past 256 bins
    x = np.arange(600, dtype=np.float32)
    payload = wide.encode(x)
    assert payload["codes"].dtype == np.uint16 and wide.compressed_nbytes(600) == 1200 + 4 * 300
    check_sketch(wide, x, payload, wide.decode(payload, 600))
    assert np.unique(payload["codes"]).size == 300  # 600 distinct values: two per bin
    with pytest.raises(ValueError, match="quantiles"):
        get_codec("sketch:quantiles=1")


def test_dithering_rounds_to_the_levels_around_x_over_its_maximum():
    payload, y = round_trip("dithering:levels=4", [2.0, -1.0, 0.5, 0.0])
    # s = 2, L = 4: |x| / s * L = 4, 2, 1, 0 are levels already (no randomness); decoded as level * s / L
    assert payload["levels"].tolist() == [4, -2, 1, 0] and y.tolist() == [2.0, -1.0, 0.5, 0.0]
    draws = np.array([round_trip("dithering:levels=4", [2.0, 0.3], seed)[1][1] for seed in range(4000)])
    assert set(draws) == {0.0, 0.5} and abs(draws.mean() - 0.3) < 0.01  # 0.6 of a level: 1 with probability 0.6
    # natural, L = 2^(3-1) = 4 with levels 0, 1, 2, 4: 3 -> 2 or 4 (p 1/2), 1.5 -> 1 or 2 (p 1/2), 0.4 -> 0 or 1
    draws = np.array([round_trip("dithering:levels=3,partition=natural", [4.0, 3.0, 1.5, 0.4], seed)[0]["levels"]
                      for seed in range(4000)])
    assert [sorted(set(draws[:, i])) for i in range(4)] == [[4], [2, 4], [1, 2], [0, 1]]
    np.testing.assert_allclose(draws.mean(0), [4, 3, 1.5, 0.4], rtol=0.03)
    for spec in ("dithering:levels=6,partition=natural", "dithering:levels=8,partition=natural"):  # L = 128: int16
        codec, x = get_codec(spec), np.random.default_rng(1).standard_normal(5000).astype(np.float32)
        payload = codec.encode(x, 3)
        assert payload["levels"].dtype == (np.int8 if codec.top <= 127 else np.int16)
        assert sum(a.nbytes for a in payload.values()) == codec.compressed_nbytes(5000)
        check_dithering(codec, x, payload, codec.decode(payload, 5000))
    with pytest.raises(ValueError, match="partition"):
        get_codec("dithering:partition=l2")


# -- efsignsgd: an alias of onebit, equal to GRACE's definition -------------------------------------------------------


def grace_efsignsgd(x: np.ndarray) -> np.ndarray:
    """GRACE's EFSignSGD compressor, written from its definition: the sign of ``x >= 0`` and ``mean(|x|)``, decoded
    as ``mean * (2 * sign - 1)``."""
    sign = (x >= 0).astype(np.float64)
    return (np.abs(x.astype(np.float64)).mean() * (2 * sign - 1)).astype(np.float32)


def test_efsignsgd_is_onebit_and_equal_to_graces_definition():
    assert ALIASES["efsignsgd"] == "onebit"

    class Shadow(type(get_codec("onebit"))):
        name = "efsignsgd"

    with pytest.raises(ValueError, match="'efsignsgd' is an alias of 'onebit'"):
        register_codec(Shadow)
    codec = get_codec("efsignsgd")
    assert codec == get_codec("onebit") and codec.name == "onebit"
    rng = np.random.default_rng(0)
    for x in (rng.standard_normal(1001).astype(np.float32), np.array([0.0, -0.0, 3.0, -1.0], np.float32),
              rng.integers(-2, 3, 300).astype(np.float32)):
        np.testing.assert_allclose(codec.decode(codec.encode(x), x.size), grace_efsignsgd(x), rtol=1e-6)
    # GRACE's memory keeps e <- (e + lr g) - C(e + lr g) and its aggregate divides by lr; at a constant lr that is
    # lr times casync's plain error feedback (C is positively homogeneous), step after step
    lr, grace_e, ours_e = 0.1, np.zeros(50), np.zeros(50, np.float32)
    for step in range(20):
        g = rng.standard_normal(50).astype(np.float32)
        corrected = grace_e + lr * g
        sent = grace_efsignsgd(corrected.astype(np.float32)).astype(np.float64)
        grace_e = corrected - sent
        payload, ours_e = codec.encode_feedback(g, ours_e)
        np.testing.assert_allclose(sent / lr, codec.decode(payload, 50), rtol=1e-4, atol=1e-6)


# -- signSGD's majority vote ---------------------------------------------------------------------------------------------

SHAPES = {"w": (41,), "b": (5,)}


def vote(grads: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    return np.where(np.sum([np.where(g[name] >= 0, 1, -1) for g in grads], axis=0) >= 0, 1, -1).astype(np.float32)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_signsgd_is_the_majority_vote_on_ps_with_dedicated_servers(workers):
    """One server merges every worker's signs (their mean) and encodes the sign of that: the vote; a tie (two
    workers disagreeing) is +1, as GRACE's ``sum >= 0``."""
    plan = casync.build_plan(SHAPES, workers=workers, strategy="ps", servers=2, codec="signsgd", bucket_bytes=0)
    assert not any(b.uses_error_feedback for b in plan.buckets)  # not contractive: "auto" is off
    rng = np.random.default_rng(workers)
    grads = [{k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(workers)]
    if workers == 2:
        grads[1]["w"][:10] = -grads[0]["w"][:10]  # ten ties
    out = casync.LocalEngine(plan).sync(grads)
    for w in range(workers):
        for name in SHAPES:
            np.testing.assert_array_equal(out[w][name], vote(grads, name))


@pytest.mark.parametrize("kw", [dict(strategy="ring"), dict(strategy="allgather"), dict(strategy="ps"),
                                dict(strategy="ps", servers=2, two_way=False)], ids=str)
def test_signsgd_is_refused_where_the_vote_is_not_exact_naming_the_strategy(kw):
    with pytest.raises(PlanError, match=f"majority vote, which strategy '{kw['strategy']}'.*servers=S"):
        casync.build_plan(SHAPES, workers=3, codec="signsgd", **kw)


def test_signsgd_refuses_error_feedback():
    with pytest.raises(ValueError, match="error_feedback=True with codec 'signsgd'"):
        casync.build_plan(SHAPES, workers=2, strategy="ps", servers=1, codec="signsgd", error_feedback=True)


def test_casync_codecs_lists_every_codec_with_its_ratio_error_feedback_throughput_and_aliases(capsys):
    from casync.cli import main
    from casync.primitives.codecs import available_codecs

    assert main(["codecs"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == set(available_codecs())
    assert rows["signsgd"][1:4] == ["32", "off,", "votes"] and rows["dithering"][1:3] == ["4", "contractive"]
    assert rows["onebit"][-1] == "efsignsgd" and rows["natural"][2] == "plain"
    for name, row in rows.items():  # every codec is priced by the packaged profile: enc and dec GB/s
        cells = row[3:5] if name != "signsgd" else row[4:6]
        assert all(float(c) > 0 for c in cells), (name, row)


def test_dithering_natural_levels_follow_bytepss_rule():
    """BytePS: ``floor = RoundNextPow2(ceil(y)) >> 1``, ``length = max(floor, 1)``: checked for every ceil up to 2^14."""
    codec = get_codec("dithering:levels=15,partition=natural")
    y = np.concatenate([np.arange(0, 2**14 + 3, dtype=np.float32), np.float32([0.3, 1.5, 2.5, 3.999, 4.001])])
    low, gap = np.empty_like(y), np.empty_like(y)
    codec._bracket(y.copy(), low, gap)
    for v, lo, length in zip(y.tolist(), low.tolist(), gap.tolist()):
        c = int(np.ceil(v))
        floor = (1 << (c - 1).bit_length()) >> 1 if c > 0 else 0  # the smallest power of two >= c, halved
        assert (lo, length) == (floor, max(floor, 1)), v
