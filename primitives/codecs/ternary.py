"""Two-bit codecs: ``terngrad`` (stochastic ternary) and ``tbq`` (threshold binary).

Both send one float32 magnitude ``v`` and a code per element, packed four to a
byte (element ``4j+i`` in bits ``2i..2i+1`` of byte ``j``): 0 → 0, 1 → +v,
2 → -v.  Decoding expands each byte through a 256 x 4 lookup table.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .base import (
    CHUNK,
    Payload,
    as_input,
    check_length,
    check_seed,
    expand_packed,
    field,
    norms,
    real_param,
    scratch,
)
from .blocks import BlockDecoder

_U32 = np.dtype("<u4")  # the packing below reads 4 code bytes as one little-endian word
#: Multiplying a word of four 2-bit codes (one per byte) by this gathers them into
#: its top byte: code i moves from bit 8i to bit 24+2i; no partial product carries.
_GATHER = np.uint32((1 << 24) | (1 << 18) | (1 << 12) | (1 << 6))
#: ``_CODES[b, i]`` is the code of element i in byte b.
_CODES = (np.arange(256, dtype=np.uint8)[:, None] >> np.arange(0, 8, 2, dtype=np.uint8)) & 3


def codes_nbytes(n: int) -> int:
    """Bytes of packed 2-bit codes for ``n`` elements."""
    return (n + 3) // 4


Fill = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def pack_codes(x: np.ndarray, fill: Fill, out: np.ndarray, start: int) -> None:
    """Pack the codes of block ``x`` (starting at element ``start``, a multiple of 4) into ``out``.

    ``fill(x, pos, neg)`` writes the "+v" and "-v" masks of the block into the bool
    arrays ``pos`` and ``neg``; an element must not be in both.
    """
    m = x.size
    m4 = (m + 3) & ~3
    pos = scratch("pos", np.bool_, m4)
    neg = scratch("neg", np.bool_, m4)
    fill(x, pos[:m], neg[:m])
    pos[m:] = False
    neg[m:] = False
    word, neg32 = pos.view(_U32), neg.view(_U32)
    np.left_shift(neg32, 1, out=neg32)
    np.bitwise_or(word, neg32, out=word)  # code bytes: pos | neg << 1
    np.multiply(word, _GATHER, out=word)
    np.right_shift(word, 24, out=word)
    np.copyto(out[start >> 2 : (start + m4) >> 2], word, casting="unsafe")


def unpack_codes(codes: np.ndarray, v: np.floating, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """Expand packed codes into ``out`` or a fresh float32 array: 0 → 0, 1 → +v, 2 → -v."""
    return expand_packed(np.array([0.0, v, -v, 0.0], np.float32)[_CODES], codes, n, out=out)


def _max_abs(x: np.ndarray) -> float:
    """``max|x|`` (0 for empty); max and min are taken block by block, while in cache."""
    top = 0.0
    for start in range(0, x.size, CHUNK):
        xc = x[start : start + CHUNK]
        top = max(top, float(xc.max()), -float(xc.min()))
    return top


class TernGradCodec(BlockDecoder):
    """TernGrad (Wen et al. 2017): ``s = max|x|``; element i becomes
    ``s * sign(x_i) * b_i`` with ``b_i ~ Bernoulli(|x_i| / s)`` — unbiased.

    Payload: ``codes`` uint8[ceil(n/4)], ``scale`` float32[1] (= s).

    Its variance is ``s ||x||_1 - ||x||^2``, so ``1 + omega = s ||x||_1 / ||x||^2`` (about 3.4 for Gaussian
    data of a million elements): plain error feedback is unsound.  :meth:`encode_contractive` sends the
    same codes with the scale ``||x||^2 / ||x||_1`` instead of ``s``, i.e. the output times ``1 / (1 + omega)``.
    """

    name = "terngrad"
    ef_sound = False

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        s = np.float32(_max_abs(x))
        codes = np.empty(codes_nbytes(n), np.uint8)
        rng = np.random.default_rng(check_seed(seed))
        cut = scratch("cut", np.float32, min(n, CHUNK))

        def fill(xc: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> None:
            # keep iff u * s < |x| with u ~ U[0, 1): probability |x| / s.
            t = cut[: xc.size]
            rng.random(out=t, dtype=np.float32)
            np.multiply(t, s, out=t)
            np.greater(xc, t, out=pos)
            np.negative(t, out=t)
            np.less(xc, t, out=neg)

        for start in range(0, n, CHUNK):
            pack_codes(x[start : start + CHUNK], fill, codes, start)
        return {"codes": codes, "scale": np.array([s], np.float32)}

    def encode_contractive(self, x: np.ndarray, seed: int = 0) -> Payload:
        payload = self.encode(x, seed)
        l1, l2 = norms(as_input(x))
        payload["scale"] = np.array([l2 / l1 if l1 > 0 else 0.0], np.float32)
        return payload

    def _decode(self, payload: Payload, n: int, start: int, stop: int | None, out: np.ndarray | None) -> np.ndarray:
        """Elements ``start:stop`` (None: to the end) of the decoded tensor, into ``out`` or a fresh array."""
        n = check_length(n)
        stop = n if stop is None else stop
        codes = field(payload, "codes", np.uint8, (codes_nbytes(n),), self.name)
        s = field(payload, "scale", np.float32, (1,), self.name)[0]
        return unpack_codes(codes[start >> 2 : (stop + 3) >> 2], s, stop - start, out)

    def compressed_nbytes(self, n: int) -> int:
        return codes_nbytes(check_length(n)) + 4


class TBQCodec(BlockDecoder):
    """Threshold binary quantization (Strom 2015; HiPress TBQ; MXNet "2bit"):
    ``x > tau`` → ``+tau``, ``x < -tau`` → ``-tau``, otherwise 0.

    ``threshold`` (tau) is an absolute magnitude; the default 0.5 is MXNet's
    2-bit compression default.  With error feedback the dropped mass is
    carried to later steps, so tau trades latency of small updates for size.
    It never sends more than tau per element and step: error feedback is its
    design (sound while gradients stay below tau; a value persistently above
    it saturates, with or without error feedback).

    Payload: ``codes`` uint8[ceil(n/4)], ``threshold`` float32[1].
    """

    name = "tbq"
    ef_sound = True
    ignores_seed = True

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = real_param(self.name, "threshold", threshold, "a finite float > 0", lambda v: v > 0)
        self._tau = np.float32(self.threshold)
        if not (np.isfinite(self._tau) and self._tau > 0):
            raise ValueError(
                f"codec {self.name!r}: parameter 'threshold' must be representable as a "
                f"positive finite float32, got {threshold!r}"
            )

    def params(self) -> dict[str, Any]:
        return {"threshold": self.threshold}

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        tau = self._tau
        codes = np.empty(codes_nbytes(n), np.uint8)

        def fill(xc: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> None:
            np.greater(xc, tau, out=pos)
            np.less(xc, -tau, out=neg)

        for start in range(0, n, CHUNK):
            pack_codes(x[start : start + CHUNK], fill, codes, start)
        return {"codes": codes, "threshold": np.array([tau], np.float32)}

    def _decode(self, payload: Payload, n: int, start: int, stop: int | None, out: np.ndarray | None) -> np.ndarray:
        """Elements ``start:stop`` (None: to the end) of the decoded tensor, into ``out`` or a fresh array."""
        n = check_length(n)
        stop = n if stop is None else stop
        codes = field(payload, "codes", np.uint8, (codes_nbytes(n),), self.name)
        tau = field(payload, "threshold", np.float32, (1,), self.name)[0]
        return unpack_codes(codes[start >> 2 : (stop + 3) >> 2], tau, stop - start, out)

    def compressed_nbytes(self, n: int) -> int:
        return codes_nbytes(check_length(n)) + 4
