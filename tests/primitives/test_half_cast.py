"""fp16's casts go through PyTorch where the process has imported it: the same bits as NumPy's, both ways."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from casync.primitives.codecs import get_codec
from casync.primitives.codecs.dense import TORCH_CAST_MIN, cast

torch = pytest.importorskip("torch")


def _float32_edges() -> np.ndarray:
    """Every finite float16 value, the midpoints between neighbours (ties: round to nearest even) and just off
    them, the overflow threshold (65520 rounds to inf), subnormals, signed zeros, infinities, a quiet NaN, and
    random values over many magnitudes."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.sort(halves[np.isfinite(halves)].astype(np.float64))
    mids = (finite[:-1] + finite[1:]) / 2
    rng = np.random.default_rng(0)
    random = rng.standard_normal(1 << 16) * 10.0 ** rng.integers(-9, 6, 1 << 16)
    values = np.concatenate([finite, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                             [65504, 65519.99, 65520, 65536, 1e-8, 5.9e-8, 3e-8, -0.0, np.inf, -np.inf, np.nan],
                             random]).astype(np.float32)
    return values


def _numpy_cast(src: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(over="ignore"):
        return src.astype(dtype)


def test_to_half_through_torch_gives_numpys_bits():
    edges = _float32_edges()
    assert edges.size >= TORCH_CAST_MIN  # the torch path is the one taken
    for src in (edges, edges[:-5]):
        got = cast(src, np.empty(src.size, np.float16))
        want = _numpy_cast(src, np.float16)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


def test_from_half_through_torch_gives_numpys_bits():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for values in (halves, halves[:-7]):  # a length PyTorch's vector loop does not divide: its tail is scalar code
        got = cast(values, np.empty(values.size, np.float32))
        want = _numpy_cast(values, np.float32)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("n", [5, TORCH_CAST_MIN + 3, 3 * (1 << 18) + 11])
def test_fp16_codec_is_the_same_with_and_without_torch(monkeypatch, n):
    """Engines in processes with and without torch agree: encode, decode, decode_into and error feedback."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 300).astype(np.float32)
    residual = rng.standard_normal(n).astype(np.float32)
    codec = get_codec("fp16")

    def run() -> list[np.ndarray]:
        payload = codec.encode(x)
        into = codec.decode_into(payload, n, np.empty(n, np.float32))
        ef_payload, remainder = codec.encode_feedback(x, residual, 0)
        return [payload["values"].view(np.uint16), codec.decode(payload, n).view(np.uint32), into.view(np.uint32),
                ef_payload["values"].view(np.uint16), remainder.view(np.uint32)]

    with_torch = run()
    monkeypatch.setitem(sys.modules, "torch", None)  # as in a process that never imported torch
    without = run()
    for a, b in zip(with_torch, without):
        assert np.array_equal(a, b)
