"""``onebit``: 1-bit SGD / BytePS onebit — one sign bit per element plus one scale.

The scale is ``mean(|x|)``, so the decoded tensor has the input's L1 norm.
"""
from __future__ import annotations

import numpy as np

from .base import CHUNK, Codec, Payload, as_input, check_length, field, scratch

#: ``_BITS[b, j]`` is bit ``j`` of byte ``b`` in ``np.packbits``' (big-endian) order.
_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(bool)
_ONES = np.ones(CHUNK, np.float32)
_ONES.flags.writeable = False


def abs_sum(x: np.ndarray) -> float:
    """``sum(|x|)`` in float64 over float32 blocks, one cache-resident pass per block."""
    total = 0.0
    buf = scratch("abs", np.float32, min(x.size, CHUNK))
    for start in range(0, x.size, CHUNK):
        a = buf[: min(CHUNK, x.size - start)]
        np.abs(x[start : start + CHUNK], out=a)
        total += float(block_sum(a))
    return total


def block_sum(a: np.ndarray) -> np.float32:
    """Sum of a float32 block in a fixed, CPU-independent order (16 lanes, then pairwise).

    Unlike ``np.dot`` (BLAS kernels differ between CPUs), the order of additions is
    part of this code, so every machine computes bit-identical scales.
    """
    m = a.size & ~15
    lanes = np.add.reduce(a[:m].reshape(16, -1), axis=0) if m else a[:0]
    return np.add.reduce(lanes) + np.add.reduce(a[m:])


def pack_signs(x: np.ndarray) -> np.ndarray:
    """``np.packbits(x < 0)`` computed block by block (big-endian bit order)."""
    n = x.size
    bits = np.empty((n + 7) // 8, np.uint8)
    mask = scratch("mask", np.bool_, min(n, CHUNK))
    for start in range(0, n, CHUNK):
        b = mask[: min(CHUNK, n - start)]
        np.less(x[start : start + CHUNK], 0, out=b)
        bits[start >> 3 : (start + b.size + 7) >> 3] = np.packbits(b)
    return bits


class OneBitCodec(Codec):
    """Sign bits (``x < 0`` → 1) packed with ``np.packbits`` plus ``scale = mean(|x|)``.

    Payload: ``bits`` uint8[ceil(n/8)], ``scale`` float32[1].  Decodes to
    ``+scale`` where the bit is 0 and ``-scale`` where it is 1.
    """

    name = "onebit"

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        bits = np.empty((n + 7) // 8, np.uint8)
        mask = scratch("mask", np.bool_, min(n, CHUNK))
        mag = scratch("abs", np.float32, min(n, CHUNK))
        total = 0.0
        # One sweep: each block is read from memory once, then hit in cache.
        for start in range(0, n, CHUNK):
            xc = x[start : start + CHUNK]
            m = xc.size
            b = mask[:m]
            np.less(xc, 0, out=b)
            bits[start >> 3 : (start + m + 7) >> 3] = np.packbits(b)
            a = mag[:m]
            np.abs(xc, out=a)
            total += float(_SUM(a))
        scale = np.array([total / n if n else 0.0], np.float32)
        return {"bits": bits, "scale": scale}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        n = check_length(n)
        bits = field(payload, "bits", np.uint8, ((n + 7) // 8,), self.name)
        s = field(payload, "scale", np.float32, (1,), self.name)[0]
        # 256 x 8 lookup table: each payload byte expands to 8 floats in one take.
        lut = np.where(_BITS, -s, s).astype(np.float32)
        out = np.empty(n, np.float32)
        full = n >> 3
        np.take(lut, bits[:full], axis=0, out=out[: full * 8].reshape(full, 8), mode="wrap")
        if n & 7:
            out[full * 8 :] = lut[bits[full], : n & 7]
        return out

    def compressed_nbytes(self, n: int) -> int:
        return (check_length(n) + 7) // 8 + 4


def _dot_sum(a: np.ndarray) -> np.float32:
    return np.dot(a, _ONES[: a.size])


_SUM = block_sum
