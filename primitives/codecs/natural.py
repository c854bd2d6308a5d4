"""``natural``: natural compression (Horvath et al. 2019, "Natural compression for distributed deep learning"), as
GRACE's TensorFlow compressor defines it: each float32 becomes one byte, its sign and a power of two.

The magnitude ``2^e (1 + m / 2^23)`` (exponent ``e``, mantissa ``m``) is rounded to ``2^e`` or ``2^(e+1)``, up
with probability ``m / 2^23``: unbiased, with variance at most ``||x||^2 / 8``.  The byte holds the sign in its
top bit and, in its low seven, the biased float32 exponent clipped to [18, 145] minus 18: code ``c`` in 1..127
decodes to ``+-2^(c - 109)``, code 0 to zero.  So magnitudes below ``2^-108`` (zeros, subnormals) become zero
and magnitudes of ``2^18`` and above saturate at ``2^18``, as in GRACE.
"""
from __future__ import annotations

import numpy as np

from .base import CHUNK, Codec, Payload, as_input, check_length, check_seed, field, scratch

#: The biased float32 exponents a code can hold: ``LOW`` (code 0, decoded as zero) to ``LOW + 127``.
LOW = 18
_MANTISSA = np.uint32((1 << 23) - 1)


def _table() -> np.ndarray:
    """``_TABLE[b]``: the float byte ``b`` decodes to (sign bit 7, exponent code bits 0..6; code 0 is a signed zero)."""
    codes = np.arange(256, dtype=np.uint32)
    exponent = codes & 0x7F
    word = ((exponent + LOW) << 23) * (exponent > 0) | (codes & 0x80) << 24
    table = word.astype(np.uint32).view(np.float32).copy()
    table.flags.writeable = False
    return table


_TABLE = _table()


class NaturalCodec(Codec):
    """Natural compression: one byte per element (sign, and an exponent rounded up with probability
    ``mantissa / 2^23``).

    Payload: ``codes`` uint8[n] (a 4x ratio).  Decodes through a 256-entry table.

    Differs from GRACE in two details, both so it is exactly unbiased: GRACE draws its uniform integer from
    ``[0, 2^23 - 1)`` and rounds up when the mantissa exceeds it (probability ``m / (2^23 - 1)``); casync draws from
    ``[0, 2^23)`` and rounds up when the draw is below the mantissa (probability ``m / 2^23``).  Its randomness
    comes from the plan's seed (NumPy's PCG64), not TensorFlow's generator.  (GRACE's PyTorch version computes
    the same rounding from ``log2``, but rounds exact powers of two up and decodes zero as ``2^-110``; the
    TensorFlow version, followed here, does neither.)

    **Error feedback.**  ``E||C(x) - x||^2 <= ||x||^2 / 8``: contractive in expectation (delta = 7/8), and every
    element keeps its sign and never grows past twice its magnitude, so plain error feedback is sound
    (``ef_sound``), clipping included (a saturated or flushed element's residual is smaller than the element).
    """

    name = "natural"
    ef_sound = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        rng = np.random.default_rng(check_seed(seed))
        codes = np.empty(n, np.uint8)
        w = scratch("natural-word", np.uint32, min(n, CHUNK))
        up = scratch("natural-up", np.bool_, min(n, CHUNK))
        for start in range(0, n, CHUNK):
            xc = x[start:start + CHUNK].view(np.uint32)
            m = xc.size
            wm, um = w[:m], up[:m]
            draw = rng.integers(0, 1 << 23, size=m, dtype=np.uint32)  # (Generator.integers takes no out=)
            np.bitwise_and(xc, _MANTISSA, out=wm)
            np.less(draw, wm, out=um)  # round the exponent up with probability mantissa / 2^23
            np.right_shift(xc, 23, out=wm)
            np.bitwise_and(wm, 0xFF, out=wm)
            np.add(wm, um, out=wm, casting="unsafe")
            np.clip(wm, LOW, LOW + 127, out=wm)
            np.subtract(wm, LOW, out=wm)
            np.right_shift(xc, 24, out=draw)
            np.bitwise_and(draw, 0x80, out=draw)
            np.bitwise_or(wm, draw, out=wm)
            np.copyto(codes[start:start + m], wm, casting="unsafe")
        return {"codes": codes}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        n = check_length(n)
        codes = field(payload, "codes", np.uint8, (n,), self.name)
        return np.take(_TABLE, codes)

    def decode_into(self, payload: Payload, n: int, out: np.ndarray) -> np.ndarray:
        n = check_length(n)
        codes = field(payload, "codes", np.uint8, (n,), self.name)
        return np.take(_TABLE, codes, out=out)

    def compressed_nbytes(self, n: int) -> int:
        return check_length(n)
