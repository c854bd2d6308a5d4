"""``sketch``: quantile buckets (SketchML: Jiang et al., SIGMOD 2018), as GRACE's TensorFlow compressor defines it:
``quantiles`` + 1 edges at evenly spaced quantiles of ``x`` split it into ``quantiles`` bins; each element sends
its bin's index and decodes to the mean of its bin.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import Codec, Payload, as_input, check_length, field, int_param

MAX_QUANTILES = 1 << 16


def quantile_edges(x: np.ndarray, q: int) -> np.ndarray:
    """The ``j / q`` quantiles of ``x`` for ``j = 0..q`` (float64, ascending), linearly interpolated between the
    order statistics around position ``j (n - 1) / q`` (Hyndman and Fan's type 7, ``tfp.stats.quantiles``' and
    NumPy's ``"linear"``): one sort instead of ``np.quantile``'s selection for each of ``q + 1`` quantiles."""
    ordered = np.sort(x).astype(np.float64)
    position = np.linspace(0.0, x.size - 1, q + 1)
    below = np.floor(position).astype(np.int64)
    above = np.minimum(below + 1, x.size - 1)
    lo, hi = ordered[below], ordered[above]
    with np.errstate(invalid="ignore"):  # inf - inf: the nonfinite path sends such elements on the side
        edges = lo + (hi - lo) * (position - below)
    return np.maximum.accumulate(edges)  # rounding must not break the order


class SketchCodec(Codec):
    """Quantile sketch: edges ``q_j`` = the ``j / Q`` quantile of ``x`` (linear interpolation, ``j = 0..Q``),
    ``bin(x_i)`` = the last ``j < Q`` with ``q_j <= x_i``, and ``means[b]`` = the mean of bin ``b``'s elements (0
    for an empty bin: equal edges leave bins empty).

    Payload: ``codes`` uint8[n] (uint16[n] for more than 256 quantiles) and ``means`` float32[Q]; n (or 2n) +
    4Q bytes.  Deterministic.

    Follows GRACE (``tfp.stats.quantiles`` with linear interpolation, ``find_bins``, ``unsorted_segment_mean``),
    except: one byte holds 256 bins (GRACE widens to uint16 from 256 quantiles on); the means are summed in
    float64; quantiles are interpolated in float64 (the same definition, Hyndman and Fan's type 7).

    **Error feedback.**  Each bin's mean is the orthogonal projection of ``x`` onto the vectors constant on its
    bins, so ``||x - C(x)||^2 = ||x||^2 - sum_b n_b m_b^2``: never larger than ``||x||`` and smaller wherever a bin's
    mean is not zero; with two or more quantiles the top (or bottom) bin holds the largest (smallest) elements and
    its mean is nonzero for any nonzero ``x``.  Plain error feedback (``ef_sound``); one quantile sends only the
    mean, which is zero for a zero-mean ``x``: refused below 2.
    """

    name = "sketch"
    ef_sound = True
    ignores_seed = True

    def __init__(self, quantiles: int = 256) -> None:
        self.quantiles = int_param(self.name, "quantiles", quantiles, 2, MAX_QUANTILES)
        self._dtype = np.dtype(np.uint8 if self.quantiles <= 256 else np.uint16)

    def params(self) -> dict[str, Any]:
        return {"quantiles": self.quantiles}

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        q = self.quantiles
        if x.size == 0:
            return {"codes": np.zeros(0, self._dtype), "means": np.zeros(q, np.float32)}
        edges = quantile_edges(x, q)
        bins = np.searchsorted(edges, x, side="right")  # 1..q+1: the bin + 1 (the largest element: q + 1)
        np.subtract(bins, 1, out=bins)
        np.clip(bins, 0, q - 1, out=bins)
        counts = np.bincount(bins, minlength=q)
        sums = np.bincount(bins, weights=x, minlength=q)  # float64
        means = np.divide(sums, counts, out=np.zeros(q), where=counts > 0)
        return {"codes": bins.astype(self._dtype), "means": means.astype(np.float32)}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        return self.decode_into(payload, n, None)

    def decode_into(self, payload: Payload, n: int, out: np.ndarray | None) -> np.ndarray:
        n = check_length(n)
        codes = field(payload, "codes", self._dtype, (n,), self.name)
        means = field(payload, "means", np.float32, (self.quantiles,), self.name)
        return np.take(means, codes, out=out)

    def compressed_nbytes(self, n: int) -> int:
        return check_length(n) * self._dtype.itemsize + 4 * self.quantiles
