"""Sparsifiers: ``topk`` (largest magnitudes, DGC-style) and ``randomk`` (seeded random subset).

Both keep ``k = ceil(ratio * n)`` elements (at least one when ``n > 0``) and send
their float32 values unscaled: the dropped mass is what error feedback carries.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import (
    CHUNK,
    Codec,
    Payload,
    as_input,
    check_length,
    check_seed,
    field,
    real_param,
    scratch,
)

#: Below this many elements one argpartition over everything beats sampling.
DIRECT_BELOW = 1 << 15


def sparse_k(ratio: float, n: int) -> int:
    """``ceil(ratio * n)`` clamped to ``[1, n]`` (0 for ``n == 0``).

    The product is rounded to 6 decimals first so that e.g. 0.07 * 100 gives 7, not 8.
    """
    if n <= 0:
        return 0
    return min(n, max(1, math.ceil(round(ratio * n, 6))))


def index_dtype(n: int) -> np.dtype:
    """Dtype of sent indices: uint32 when every index fits, else int64."""
    return np.dtype(np.uint32 if n < 2**32 else np.int64)


class _SparseCodec(Codec):
    """Shared ``ratio`` parameter handling."""

    sparse = True

    def __init__(self, ratio: float = 0.01) -> None:
        # (stored as ``_ratio``: ``Codec.ratio(n)`` is the compression ratio)
        self._ratio = real_param(self.name, "ratio", ratio, "a float in (0, 1]", lambda v: 0 < v <= 1)

    def params(self) -> dict[str, Any]:
        return {"ratio": self._ratio}

    def k(self, n: int) -> int:
        """Number of elements kept out of ``n``."""
        return sparse_k(self._ratio, check_length(n))


# -- top-k ---------------------------------------------------------------------


def topk_indices(x: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Ascending int64 indices of the ``k`` largest ``|x|``; ties go to the lower index.

    No full sort: as in DGC, a threshold is estimated from a seeded random sample,
    the (few) elements at or above it are collected in one blocked pass, and the
    exact k-th magnitude is found by partitioning those candidates only.  If the
    estimate keeps too few, a lower one is tried, then the whole array.  The
    result does not depend on ``seed`` — only the time it takes does.
    """
    n = x.size
    if k <= 0:
        return np.zeros(0, np.int64)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if n < DIRECT_BELOW or 8 * k > n:
        return _select(x, None, k)
    for t in _sample_thresholds(x, k, seed):
        cand = indices_at_least(x, t)
        if cand.size >= k:
            return _select(x, cand, k)
    return _select(x, None, k)


def _sample_thresholds(x: np.ndarray, k: int, seed: int) -> list[np.float32]:
    """Magnitudes that, judging by a random sample, about 1.3k (then ~4k) elements exceed."""
    n = x.size
    m = min(n // 32, max(2048, -(-64 * n // k)))
    rng = np.random.default_rng(seed)
    sample = np.abs(x[rng.integers(0, n, size=m)])
    mu = m * k / n  # expected sample hits above the true k-th magnitude
    ranks = sorted({min(m, math.ceil(mu + 3 * math.sqrt(mu)) + 1), min(m, 4 * math.ceil(mu) + 8)})
    sample = np.partition(sample, [m - r for r in ranks])
    return [sample[m - r] for r in ranks]


def indices_at_least(x: np.ndarray, t: np.floating) -> np.ndarray:
    """``np.flatnonzero(|x| >= t)`` without its slow path on sparse masks.

    ``np.nonzero`` on a bool array with < 10% True values branches per hit; here
    the mask is first scanned 8 bytes at a time and only the non-zero words are
    expanded, so both scans stay dense enough for NumPy's branch-free loop.
    """
    n = x.size
    c = min(n, CHUNK)
    mag = scratch("mag", np.float32, c)
    mask = scratch("mask8", np.bool_, (c + 7) & ~7)
    any8 = scratch("any8", np.bool_, (c + 7) >> 3)
    parts = []
    for start in range(0, n, CHUNK):
        xc = x[start : start + CHUNK]
        m = xc.size
        m8 = (m + 7) & ~7
        a, b = mag[:m], mask[:m8]
        np.abs(xc, out=a)
        np.greater_equal(a, t, out=b[:m])
        b[m:] = False
        words = b.view(np.uint64)
        hit = any8[: m8 >> 3]
        np.not_equal(words, 0, out=hit)
        wi = np.flatnonzero(hit)
        if wi.size == 0:
            continue
        pos = np.flatnonzero(words[wi].view(np.bool_))
        idx = wi[pos >> 3]
        idx <<= 3
        idx += pos & 7
        idx += start
        parts.append(idx)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _select(x: np.ndarray, cand: np.ndarray | None, k: int) -> np.ndarray:
    """The top-k of ``x`` among ascending candidate indices ``cand`` (None: all)."""
    v = x if cand is None else x[cand]
    a = np.abs(v)
    mc = a.size
    if mc > k:
        kth = np.partition(a, mc - k)[mc - k]
        keep = a >= kth
        extra = int(np.count_nonzero(keep)) - k
        if extra > 0:  # ties at the k-th magnitude: keep the lowest indices
            ties = np.flatnonzero(a == kth)
            keep[ties[ties.size - extra :]] = False
        return np.flatnonzero(keep) if cand is None else cand[keep]
    return np.arange(mc, dtype=np.int64) if cand is None else cand


class TopKCodec(_SparseCodec):
    """Keep exactly the ``k`` largest magnitudes (ties: lower index first).

    Payload: ``indices`` uint32[k] (int64 when n >= 2**32), ascending, and
    ``values`` float32[k].
    """

    name = "topk"

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        idx = topk_indices(x, self.k(n), check_seed(seed))
        return {"indices": idx.astype(index_dtype(n)), "values": x[idx]}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        k = self.k(n)
        idx = field(payload, "indices", index_dtype(n), (k,), self.name)
        values = field(payload, "values", np.float32, (k,), self.name)
        out = np.zeros(n, np.float32)
        out[idx] = values
        return out

    def compressed_nbytes(self, n: int) -> int:
        return self.k(n) * (index_dtype(n).itemsize + 4)


# -- random-k ------------------------------------------------------------------


def random_indices(n: int, k: int, seed: int) -> np.ndarray:
    """``k`` distinct indices in ``[0, n)``, ascending, a uniform random subset fixed by ``seed``.

    Sparse draws take the distinct values of i.i.d. uniform draws, topping up
    until there are ``k`` (the first k distinct values of an i.i.d. sequence form
    a uniform k-subset); dense ones sort a prefix of a permutation.
    """
    dtype = index_dtype(n)
    if k <= 0:
        return np.zeros(0, dtype)
    if k >= n:
        return np.arange(n, dtype=dtype)
    rng = np.random.default_rng(seed)
    if 4 * k > n:
        return np.sort(rng.permutation(n)[:k]).astype(dtype)
    idx = _sorted_unique(rng.integers(0, n, size=k, dtype=dtype))
    while idx.size < k:
        more = rng.integers(0, n, size=k - idx.size, dtype=dtype)
        idx = _sorted_unique(np.concatenate([idx, more]))
    return idx


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``a`` (sorts ``a`` in place; faster than np.unique's hashing)."""
    a.sort()
    keep = np.empty(a.size, np.bool_)
    keep[:1] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


class RandomKCodec(_SparseCodec):
    """Keep ``k`` elements at indices drawn from the seed; the indices are not sent.

    Payload: ``seed`` uint64[1] and ``values`` float32[k] (``x`` at the ascending
    indices :func:`random_indices` gives).  Values are not rescaled by n/k: with
    error feedback the unsent mass is delivered later instead.
    """

    name = "randomk"

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        seed = check_seed(seed)
        idx = random_indices(x.size, self.k(x.size), seed)
        return {"seed": np.array([seed], np.uint64), "values": x[idx]}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        k = self.k(n)
        seed = int(field(payload, "seed", np.uint64, (1,), self.name)[0])
        values = field(payload, "values", np.float32, (k,), self.name)
        out = np.zeros(n, np.float32)
        out[random_indices(n, k, seed)] = values
        return out

    def compressed_nbytes(self, n: int) -> int:
        return 8 + 4 * self.k(n)
