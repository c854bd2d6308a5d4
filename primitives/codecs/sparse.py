"""Sparsifiers: ``topk`` (largest magnitudes, DGC-style) and ``randomk`` (seeded random subset).

Both keep ``k = ceil(ratio * n)`` elements (at least one when ``n > 0``) and send
their float32 values unscaled: the dropped mass is what error feedback carries.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from .base import (
    CHUNK,
    SCATTER_BLOCK,
    Codec,
    Payload,
    add_block,
    as_input,
    ascending_in_range,
    check_length,
    check_seed,
    feedback_input,
    field,
    index_blocks,
    merges_pending,
    real_param,
    scattered,
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
        self.ratio = real_param(self.name, "ratio", ratio, "a float in (0, 1]", lambda v: 0 < v <= 1)

    def params(self) -> dict[str, Any]:
        return {"ratio": self.ratio}

    def k(self, n: int) -> int:
        """Number of elements kept out of ``n``."""
        return sparse_k(self.ratio, check_length(n))


# -- top-k ---------------------------------------------------------------------


def topk(x: np.ndarray, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices (ascending int64) and values of the ``k`` largest ``|x|``; ties go to the lower index.

    No full sort: as in DGC, a threshold is estimated from a seeded random sample,
    the few elements at or above it are collected in one blocked pass, and the
    exact k-th magnitude is found by partitioning those candidates only.  If the
    estimate keeps too few, a lower one is tried, then the whole array.  The
    result does not depend on ``seed`` -- only the time it takes does.
    """
    n = x.size
    if k >= n:
        return np.arange(n, dtype=np.int64), x.copy()
    if k <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    if n >= DIRECT_BELOW and 8 * k <= n:
        for t in _sample_thresholds(x, k, seed):
            if t == 0:  # mostly zeros: don't collect them all as candidates
                return _nonzeros_then_zeros(x, k)
            idx, vals = at_least(x, t)
            if idx.size >= k:
                return _select(idx, vals, k)
    return _select(None, x, k)


def _nonzeros_then_zeros(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k when most of ``x`` is zero: the top-k nonzeros, padded with the lowest-index zeros."""
    idx, vals = at_least(x, np.finfo(np.float32).smallest_subnormal)
    if idx.size >= k:
        return _select(idx, vals, k)
    zeros, need = [], k - idx.size
    for start in range(0, x.size, CHUNK):
        z = np.flatnonzero(x[start : start + CHUNK] == 0)[:need]
        zeros.append(z + start)
        need -= z.size
        if need == 0:
            break
    idx = np.sort(np.concatenate([idx, *zeros]))
    return idx, x[idx]


def _sample_thresholds(x: np.ndarray, k: int, seed: int) -> list[np.floating]:
    """Magnitudes that, judging by a random sample, a little over k (then ~4k) elements reach.

    The sample size balances its own cost against the candidates a looser
    estimate lets through (both ~ (n k)^(1/3)), with at least ~64 expected hits.
    """
    n = x.size
    m = int(min(n // 32, max(64 * n / k, 1.5 * (n * k) ** (1 / 3))))
    rng = np.random.default_rng(seed)
    sample = np.abs(x[rng.integers(0, n, size=m, dtype=index_dtype(n))])
    mu = m * k / n  # expected sample hits at or above the true k-th magnitude
    ranks = sorted({min(m, math.ceil(mu + 3 * math.sqrt(mu)) + 1), min(m, 4 * math.ceil(mu) + 8)})
    sample = np.partition(sample, [m - r for r in ranks])
    return [sample[m - r] for r in ranks]


def at_least(x: np.ndarray, t: np.floating) -> tuple[np.ndarray, np.ndarray]:
    """Indices (ascending int64) and values of the elements with ``|x| >= t``.

    ``np.flatnonzero`` is slow on sparse masks: below ~10% True it branches per
    hit.  So the block's bool mask is scanned hierarchically, each level dense
    enough for NumPy's branch-free loop: 16-byte groups (the OR of the block's two
    halves, viewed as uint64 words), then the words of the groups that hit,
    then the bytes of the words that hit.
    """
    n = x.size
    c = min(n, CHUNK)
    c16 = (c + 15) & ~15
    mag = scratch("mag", np.float32, c)
    mask = scratch("mask16", np.bool_, c16)
    group = scratch("group", np.uint64, c16 >> 4)
    ghit = scratch("ghit", np.bool_, c16 >> 4)
    idx_parts, val_parts = [], []
    for start in range(0, n, CHUNK):
        xc = x[start : start + CHUNK]
        m = xc.size
        m16 = (m + 15) & ~15
        half = m16 >> 4  # words per half of the block
        a, b = mag[:m], mask[:m16]
        np.abs(xc, out=a)
        np.greater_equal(a, t, out=b[:m])
        b[m:] = False
        words = b.view(np.uint64)  # 8 mask bytes per word
        lo, hi = words[:half], words[half:]
        g, gh = group[:half], ghit[:half]
        np.bitwise_or(lo, hi, out=g)  # group j = words j and j + half
        np.not_equal(g, 0, out=gh)
        gj = np.flatnonzero(gh)
        if gj.size == 0:
            continue
        w = np.concatenate([lo[gj], hi[gj]])
        wi = np.concatenate([gj, gj + half])  # ascending: every lo word precedes every hi word
        q = np.flatnonzero(w != 0)
        wi, w = wi[q], w[q]
        pos = np.flatnonzero(w.view(np.bool_))
        idx = wi[pos >> 3]
        idx <<= 3
        idx += pos & 7
        val_parts.append(xc[idx])
        idx += start
        idx_parts.append(idx)
    if not idx_parts:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    return np.concatenate(idx_parts), np.concatenate(val_parts)


def _select(idx: np.ndarray | None, vals: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-k of candidates ``vals`` at ascending indices ``idx`` (None: ``vals`` is all of x)."""
    a = np.abs(vals)
    mc = a.size
    if mc <= k:
        return (np.arange(mc, dtype=np.int64) if idx is None else idx), vals.copy()
    kth = np.partition(a, mc - k)[mc - k]
    keep = a >= kth
    extra = int(np.count_nonzero(keep)) - k
    if extra > 0:  # ties at the k-th magnitude: keep the lowest indices
        ties = np.flatnonzero(a == kth)
        keep[ties[ties.size - extra :]] = False
    pos = np.flatnonzero(keep)  # (then two takes: faster than two boolean masks)
    return (pos if idx is None else idx[pos]), vals[pos]


class TopKCodec(_SparseCodec):
    """Keep exactly the ``k`` largest magnitudes (ties: lower index first).

    Payload: ``indices`` uint32[k] (int64 when n >= 2**32), ascending, and
    ``values`` float32[k].
    """

    name = "topk"
    ef_sound = True
    decodes_sparse = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        idx, values = topk(x, self.k(n), check_seed(seed))
        return {"indices": idx.astype(index_dtype(n)), "values": values}

    def encode_keep_error(self, x: np.ndarray, seed: int = 0) -> Payload:
        """Encode, then subtract the sent values at their indices only (the rest of ``x`` is unsent)."""
        payload = self.encode(x, seed)
        x[payload["indices"]] -= payload["values"]
        return payload

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        return self._decode(payload, n, None)

    def decode_into(self, payload: Payload, n: int, out: np.ndarray) -> np.ndarray:
        return self._decode(payload, n, out)

    def _decode(self, payload: Payload, n: int, out: np.ndarray | None) -> np.ndarray:
        idx, values = self._fields(payload, n)
        return scattered(out, n, idx, values)

    def sparse_entries(self, payload: Payload, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        idx, values = self._fields(payload, n)
        if not ascending_in_range(idx, n):
            return None  # out of order or out of range: decoding it whole says what is wrong, or what it means
        return idx, values

    def _fields(self, payload: Payload, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = self.k(n)
        return (field(payload, "indices", index_dtype(n), (k,), self.name),
                field(payload, "values", np.float32, (k,), self.name))

    def compressed_nbytes(self, n: int) -> int:
        return self.k(n) * (index_dtype(n).itemsize + 4)


# -- random-k ------------------------------------------------------------------


#: Bytes of index arrays :func:`random_indices` keeps for reuse in a process (least recently used dropped first).
INDEX_CACHE_BYTES = 32 << 20


class _IndexCache:
    """The index arrays of the last (n, k, seed) drawn, read-only.  One sync draws each partition's indices several
    times in an actor (its encode, the merges of its peers' payloads at a server, the decodes): about half the
    draws of a ResNet-50 two-way PS sync repeat one already made (about 0.3 ms each for 1.6M floats here)."""

    def __init__(self) -> None:
        self._arrays: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int, int]) -> np.ndarray | None:
        with self._lock:
            hit = self._arrays.get(key)
            if hit is not None:
                self._arrays.move_to_end(key)
            return hit

    def put(self, key: tuple[int, int, int], indices: np.ndarray) -> None:
        indices.flags.writeable = False  # shared by every caller from now on
        with self._lock:
            if key in self._arrays or indices.nbytes > INDEX_CACHE_BYTES:
                return
            self._arrays[key] = indices
            self._bytes += indices.nbytes
            while self._bytes > INDEX_CACHE_BYTES:
                self._bytes -= self._arrays.popitem(last=False)[1].nbytes

    def clear(self) -> None:
        with self._lock:
            self._arrays.clear()
            self._bytes = 0


_index_cache = _IndexCache()


def forget_random_indices() -> None:
    """Drop every index array :func:`random_indices` keeps, so that the next calls draw afresh (the profiler
    times draws, as an actor's first use of a seed makes them)."""
    _index_cache.clear()


def random_indices(n: int, k: int, seed: int) -> np.ndarray:
    """``k`` distinct indices in ``[0, n)``, ascending, a uniform random subset fixed by ``seed`` (read-only: the
    array may be handed to later calls with the same arguments).

    Sparse draws take the distinct values of i.i.d. uniform draws, topping up
    until there are ``k`` (the first k distinct values of an i.i.d. sequence form
    a uniform k-subset); dense ones sort a prefix of a permutation.
    """
    key = (int(n), int(k), int(seed))
    indices = _index_cache.get(key)
    if indices is None:
        indices = _draw_indices(n, k, seed)
        _index_cache.put(key, indices)
    return indices


def _draw_indices(n: int, k: int, seed: int) -> np.ndarray:
    """What :func:`random_indices` returns, drawn afresh."""
    dtype = index_dtype(n)
    if k <= 0:
        return np.zeros(0, dtype)
    if k >= n:
        return np.arange(n, dtype=dtype)
    rng = np.random.default_rng(seed)
    if 4 * k > n:
        return np.sort(rng.permutation(n)[:k]).astype(dtype)
    idx = _sorted_unique(rng.integers(0, n, size=k, dtype=dtype))
    while idx.size < k:  # the few new values of each top-up are inserted in place: no second full sort
        more = _sorted_unique(rng.integers(0, n, size=k - idx.size, dtype=dtype))
        pos = np.searchsorted(idx, more)
        new = idx[np.minimum(pos, idx.size - 1)] != more  # (past the end: greater than the last, so new)
        idx = np.insert(idx, pos[new], more[new])
    return idx


#: Up to this many uint32 draws, two stable argsorts of their 16-bit halves (NumPy's radix sort) take half the
#: time of one comparison sort (16K draws: 0.12 against 0.25 ms here); above it NumPy's radix argsort costs
#: about 2.5x more per element and the comparison sort wins.
RADIX_MAX = 1 << 15


def _sorted(a: np.ndarray) -> np.ndarray:
    """``a`` sorted ascending (in place where it is sorted by comparison)."""
    if a.dtype != np.uint32 or a.size > RADIX_MAX:
        a.sort()
        return a
    a = a[np.argsort(a.astype(np.uint16), kind="stable")]  # low halves first (astype keeps the low 16 bits)
    return a[np.argsort((a >> 16).astype(np.uint16), kind="stable")]


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``a`` (may sort ``a`` in place; faster than np.unique's hashing)."""
    a = _sorted(a)
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
    ef_sound = True
    decodes_sparse = True
    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        seed = check_seed(seed)
        idx = random_indices(x.size, self.k(x.size), seed)
        return {"seed": np.array([seed], np.uint64), "values": x[idx]}

    def encode_keep_error(self, x: np.ndarray, seed: int = 0) -> Payload:
        """Encode, then subtract the sent values at their indices only (drawn once, not again by decoding)."""
        seed = check_seed(seed)
        n = as_input(x).size
        idx = random_indices(n, self.k(n), seed)
        values = x[idx]
        x[idx] -= values
        return {"seed": np.array([seed], np.uint64), "values": values}

    @merges_pending
    def encode_feedback(self, x: np.ndarray, residual: np.ndarray, seed: int = 0,
                        out: np.ndarray | None = None) -> tuple[Payload, np.ndarray]:
        """The sum, the sent values and the remainder block by block: each block's values are taken and
        cleared while the block just written is in cache (the same floats as adding, then taking them)."""
        x = feedback_input(x)
        n = x.size
        if residual.shape != x.shape or residual.dtype != np.float32 or n < 2 * SCATTER_BLOCK:
            return super().encode_feedback(x, residual, seed, out)
        seed = check_seed(seed)
        idx = random_indices(n, self.k(n), seed)
        corrected = np.empty(n, np.float32) if out is None else out
        values = np.empty(idx.size, np.float32)
        for start, stop, entries in index_blocks(idx, n):
            c = corrected[start:stop]
            add_block(x, residual, start, stop, c)
            at, v = idx[entries] - start, values[entries]
            np.take(c, at, out=v)
            c[at] -= v
        return {"seed": np.array([seed], np.uint64), "values": values}, corrected

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        return self._decode(payload, n, None)

    def decode_into(self, payload: Payload, n: int, out: np.ndarray) -> np.ndarray:
        return self._decode(payload, n, out)

    def _decode(self, payload: Payload, n: int, out: np.ndarray | None) -> np.ndarray:
        idx, values = self.sparse_entries(payload, n)
        return scattered(out, n, idx, values)

    def sparse_entries(self, payload: Payload, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = self.k(n)
        seed = int(field(payload, "seed", np.uint64, (1,), self.name)[0])
        values = field(payload, "values", np.float32, (k,), self.name)
        return random_indices(n, k, seed), values

    def compressed_nbytes(self, n: int) -> int:
        return 8 + 4 * self.k(n)
