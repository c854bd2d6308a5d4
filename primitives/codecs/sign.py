"""``onebit``: 1-bit SGD / BytePS onebit — one sign bit per element plus one scale.

The scale is ``mean(|x|)``, so the decoded tensor has the input's L1 norm.
"""
from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from .base import (BLOCK, Payload, add_block, as_input, block_sum, check_length, expand_packed,
                   feedback_input, field, merges_pending, scratch)
from .blocks import BlockDecoder
from . import sign_kernel
from .residual import DeferredResidual, materialized

# BLOCK: the encoder's four cheap passes measured best at half the library's CHUNK (about 10% faster than
# 2 MiB blocks at 25M floats).
#: ``_BITS[b, j]`` is bit ``j`` of byte ``b`` in ``np.packbits``' (big-endian) order.
_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(bool)


class OneBitCodec(BlockDecoder):
    """Sign bits (``x < 0`` → 1) packed with ``np.packbits`` plus ``scale = mean(|x|)``.

    Payload: ``bits`` uint8[ceil(n/8)], ``scale`` float32[1].  Decodes to
    ``+scale`` where the bit is 0 and ``-scale`` where it is 1.
    """

    name = "onebit"
    ef_sound = True
    defers_residual = True
    certifies_finite = True
    ignores_seed = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        return self._sweep(as_input(x))

    def _decode(self, payload: Payload, n: int, start: int, stop: int | None, out: np.ndarray | None) -> np.ndarray:
        """Elements ``start:stop`` (None: to the end) of the decoded tensor, into ``out`` or a fresh array."""
        n = check_length(n)
        stop = n if stop is None else stop
        bits = field(payload, "bits", np.uint8, ((n + 7) // 8,), self.name)
        s = field(payload, "scale", np.float32, (1,), self.name)[0]
        packed, m = bits[start >> 3 : (stop + 7) >> 3], stop - start
        out = np.empty(m, np.float32) if out is None else out
        cut = sign_kernel.decode_small(packed, s, m, out)  # a small block: no table, no letting the GIL go
        if cut == 0:
            return expand_packed(_table(s), packed, m, out=out)
        if cut < m:  # the last byte's first m - cut elements, as the table has them
            out[cut:m] = np.where(_BITS[packed[cut >> 3], : m - cut], -s, s)
        return out

    def encode_keep_error(self, x: np.ndarray, seed: int = 0) -> Payload:
        payload = self._sweep(as_input(x))
        _subtract_decoded(x, payload)
        return payload

    @merges_pending
    def encode_feedback(self, x: np.ndarray, residual: np.ndarray, seed: int = 0,
                        out: np.ndarray | None = None) -> tuple[Payload, np.ndarray]:
        x = feedback_input(x)
        if residual.shape != x.shape or residual.dtype != np.float32:
            return super().encode_feedback(x, residual, seed, out)
        corrected = np.empty(x.size, np.float32) if out is None else out
        payload = self._sweep(x, residual, corrected)
        _subtract_decoded(corrected, payload)
        return payload, corrected

    @merges_pending
    def encode_feedback_deferred(self, x: np.ndarray, residual: np.ndarray | DeferredResidual, seed: int = 0,
                                 out: np.ndarray | None = None) -> tuple[Payload, np.ndarray | DeferredResidual]:
        x = feedback_input(x)
        if residual.shape != x.shape or residual.dtype != np.float32:
            return super().encode_feedback(x, materialized(residual), seed, out)  # the reference path's error
        corrected = np.empty(x.size, np.float32) if out is None else out
        payload = self._sweep(x, residual, corrected)
        return payload, DeferredResidual(corrected, self, payload)

    def _sweep(self, x: np.ndarray, addend: np.ndarray | DeferredResidual | None = None,
               out: np.ndarray | None = None) -> Payload:
        """The payload of ``x``, or with ``addend`` of ``out = x + addend`` (written block by block as it is
        encoded; ``x`` may then be a merge still to run, ``addend`` a residual still to compute).  One sweep:
        each block is read from memory once, then hit in cache; where the C kernel takes the inputs
        (:mod:`casync.primitives.codecs.sign_kernel`), in one pass, with the same floats."""
        src = x if addend is None else out
        n = x.size
        bits = np.empty((n + 7) // 8, np.uint8)
        fused = sign_kernel.bind(x, addend, out, OneBitCodec)
        total = 0.0
        for start in range(0, n, BLOCK):
            stop = min(n, start + BLOCK)
            lanes, cut = fused.block(start, stop, out, bits) if fused is not None else (None, start)
            rest = self._block(x, addend, src, bits, cut, stop) if cut < stop else src[:0]
            with np.errstate(over="ignore"):
                block_total = block_sum(rest) if lanes is None else np.add.reduce(lanes) + np.add.reduce(rest)
            total += float(block_total)
        if not math.isfinite(total):  # float32 block sums overflowed: redo in float64
            total = float(np.abs(src.astype(np.float64)).sum())
        with np.errstate(over="ignore"):
            scale = np.array([total / n if n else 0.0], np.float32)
        return {"bits": bits, "scale": scale}

    @staticmethod
    def _block(x: np.ndarray, addend: np.ndarray | DeferredResidual | None, src: np.ndarray, bits: np.ndarray,
               start: int, stop: int) -> np.ndarray:
        """The NumPy sweep of ``[start, stop)`` (``start`` a multiple of 8): ``src`` computed there (``x + addend``)
        and its sign bits packed; returns ``|src[start:stop]|`` in a scratch buffer."""
        m = stop - start
        xc = src[start:stop]
        if addend is not None:
            add_block(x, addend, start, stop, xc)
        b = scratch("mask", np.bool_, m)
        np.less(xc, 0, out=b)
        bits[start >> 3 : (stop + 7) >> 3] = np.packbits(b)
        return np.abs(xc, out=scratch("abs", np.float32, m))

    def fused_merge(self, inputs: Any, divisor: int) -> sign_kernel.FusedMerge | None:
        """An all-gather's (or a one-way server's) decode-and-sum of onebit payloads in one pass, where the C
        kernel takes them (:func:`casync.primitives.codecs.sign_kernel.bind_merge`)."""
        return sign_kernel.bind_merge(inputs, divisor, OneBitCodec)

    def input_was_finite(self, payload: Payload) -> bool:
        """The scale is the mean of ``|x|``: a NaN or Inf anywhere makes every sum of it (float32 blocks, then
        the float64 redo) and so the scale NaN or Inf."""
        return math.isfinite(float(payload["scale"][0]))

    def compressed_nbytes(self, n: int) -> int:
        return (check_length(n) + 7) // 8 + 4


def _subtract_decoded(x: np.ndarray, payload: Payload) -> None:
    """``x -= decode(payload)`` block by block through a cache-sized scratch buffer: the same floats as the
    default, without a second tensor-sized array and the pass over it."""
    table, bits, n = _table(payload["scale"][0]), payload["bits"], x.size
    decoded = scratch("decoded", np.float32, min(n, BLOCK))
    for start in range(0, n, BLOCK):  # BLOCK is a multiple of 8: every block starts on a payload byte
        m = min(BLOCK, n - start)
        d = decoded[:m]
        expand_packed(table, bits[start >> 3 : (start + m + 7) >> 3], m, out=d)
        np.subtract(x[start : start + m], d, out=x[start : start + m])


def _table(scale: np.float32) -> np.ndarray:
    """256 x 8 lookup table (read-only): byte ``b`` of the payload decodes to the 8 floats ``_table(scale)[b]``.

    A merge decodes payloads block by block, and a ring hop's encode reads two (the hop's incoming payload and
    its deferred residual's) in turns, so the tables of the last few scales are kept per thread (building one
    took ~6 % of a ring/onebit actor's op time, and up to a fifth of a hop's encode in small blocks)."""
    key = np.float32(scale).view(np.uint32).item()  # by bits: -0.0 and NaNs have tables of their own
    tables = _recent_tables.__dict__.setdefault("tables", {})
    table = tables.get(key)
    if table is None:
        if len(tables) >= _TABLES_KEPT:
            del tables[next(iter(tables))]  # the oldest
        table = tables[key] = np.where(_BITS, -scale, scale).astype(np.float32)
        table.flags.writeable = False
    return table


#: Tables kept per thread: a hop reads two scales at a time; a few more cover a merge of several payloads.
_TABLES_KEPT = 8
_recent_tables = threading.local()
