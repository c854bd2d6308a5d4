"""``u8bit``: 8-bit approximation (Dettmers 2015, "8-Bit Approximations for Parallelism in Deep Learning"), as GRACE's
TensorFlow compressor defines it: ``|x| / max|x|`` is binned against 128 fixed edges and each element sends the
signed index of its bin; it decodes to that bin's lower edge times ``max|x|``.
"""
from __future__ import annotations

import numpy as np

from .base import CHUNK, Codec, Payload, as_input, check_length, field, scratch

#: The 128 bin edges of GRACE's u8bit (its ``dict128``), relative to ``max|x|``: edge ``k`` is bin ``k``'s lower
#: end and the value bin ``k`` decodes to (times ``max|x|``).  The figures are the definition's data.
EDGES = np.array([
    1.5000001e-06, 2.7500000e-06, 7.2499997e-06, 1.8750001e-05, 3.6250000e-05, 5.8749996e-05, 8.6249995e-05, 1.4375000e-04,
    2.3125000e-04, 3.1875001e-04, 4.0625001e-04, 5.1874999e-04, 6.5624999e-04, 7.9374999e-04, 9.3124999e-04, 1.2187500e-03,
    1.6562500e-03, 2.0937501e-03, 2.5312500e-03, 2.9687500e-03, 3.4062499e-03, 3.8437501e-03, 4.2812498e-03, 4.8437500e-03,
    5.5312500e-03, 6.2187500e-03, 6.9062500e-03, 7.5937500e-03, 8.2812496e-03, 8.9687500e-03, 9.6562495e-03, 1.1093750e-02,
    1.3281250e-02, 1.5468750e-02, 1.7656250e-02, 1.9843750e-02, 2.2031249e-02, 2.4218749e-02, 2.6406251e-02, 2.8593751e-02,
    3.0781250e-02, 3.2968748e-02, 3.5156250e-02, 3.7343752e-02, 3.9531250e-02, 4.1718751e-02, 4.3906249e-02, 4.6718750e-02,
    5.0156251e-02, 5.3593751e-02, 5.7031251e-02, 6.0468748e-02, 6.3906237e-02, 6.7343749e-02, 7.0781253e-02, 7.4218743e-02,
    7.7656247e-02, 8.1093743e-02, 8.4531240e-02, 8.7968737e-02, 9.1406241e-02, 9.4843738e-02, 9.8281242e-02, 1.0546875e-01,
    1.1640625e-01, 1.2734374e-01, 1.3828126e-01, 1.4921875e-01, 1.6015625e-01, 1.7109375e-01, 1.8203124e-01, 1.9296876e-01,
    2.0390625e-01, 2.1484375e-01, 2.2578125e-01, 2.3671874e-01, 2.4765626e-01, 2.5859374e-01, 2.6953125e-01, 2.8046876e-01,
    2.9140624e-01, 3.0234376e-01, 3.1328124e-01, 3.2421875e-01, 3.3515626e-01, 3.4609374e-01, 3.5703126e-01, 3.6796874e-01,
    3.7890625e-01, 3.8984376e-01, 4.0078124e-01, 4.1171876e-01, 4.2265624e-01, 4.3359375e-01, 4.4453126e-01, 4.5859376e-01,
    4.7578123e-01, 4.9296874e-01, 5.1015621e-01, 5.2734375e-01, 5.4453123e-01, 5.6171870e-01, 5.7890624e-01, 5.9609371e-01,
    6.1328125e-01, 6.3046873e-01, 6.4765620e-01, 6.6484374e-01, 6.8203121e-01, 6.9921869e-01, 7.1640623e-01, 7.3359370e-01,
    7.5078118e-01, 7.6796871e-01, 7.8515619e-01, 8.0234367e-01, 8.1953120e-01, 8.3671868e-01, 8.5390615e-01, 8.7109369e-01,
    8.8828117e-01, 9.0546864e-01, 9.2265618e-01, 9.3984365e-01, 9.5703113e-01, 9.7421867e-01, 9.9140614e-01, 9.9570298e-01,
], np.float32)
EDGES.flags.writeable = False


#: Bins by the float32 bits of a ratio in [0, 1]: ``key = bits >> _SHIFT`` cuts [0, 1] into cells 2^-9 of their
#: value wide, narrower than the closest two edges (0.43 % apart), so a cell holds at most one edge: the bin is
#: ``_FIRST[key]`` (the last edge at or below the cell's start, -1 for none) plus one where the ratio reaches
#: ``_NEXT[key]`` (the edge after it).  Two gathers and a compare instead of a binary search (about 10x faster).
_SHIFT = 14
_KEYS = (np.float32(1).view(np.uint32) >> _SHIFT) + 1


def _cells() -> tuple[np.ndarray, np.ndarray]:
    starts = (np.arange(_KEYS, dtype=np.uint32) << _SHIFT).view(np.float32)
    first = np.searchsorted(EDGES, starts, side="right").astype(np.int16) - 1  # -1..127
    following = np.append(EDGES, np.float32(np.inf))[first + 1]
    ends = ((np.arange(_KEYS, dtype=np.uint32) + 1) << _SHIFT).view(np.float32)
    if (np.searchsorted(EDGES, ends, side="left") - np.searchsorted(EDGES, starts, side="right") > 1).any():
        raise RuntimeError("u8bit: a cell of _SHIFT holds two edges; lower _SHIFT")
    return first.astype(np.int8), following.astype(np.float32)


_FIRST, _NEXT = _cells()


def _bins(r: np.ndarray) -> np.ndarray:
    """The bin (int8, 0..127) of each ratio in ``r`` (float32 in [0, 1]): the last edge at or below it, 0 below the
    first edge, 127 at or past the last."""
    keys = np.right_shift(r.view(np.uint32), _SHIFT)
    np.minimum(keys, _KEYS - 1, out=keys)  # (a NaN or Inf ratio: the nonfinite path sends those on the side)
    bins = np.take(_FIRST, keys)
    bins += np.take(_NEXT, keys) <= r
    return np.maximum(bins, 0, out=bins)


class U8BitCodec(Codec):
    """8-bit approximation: ``code = sign(x) * bin(|x| / s)``, ``s = max|x|``, decoded as
    ``sign(code) * EDGES[|code|] * s``.

    Payload: ``codes`` int8[n], ``scale`` float32[1] (= s); n + 4 bytes.

    ``bin(r)`` is the index of the last edge at or below ``r``.  Bin 0 has code 0 whatever the sign, so it
    decodes to zero, as in GRACE.  Where GRACE leaves the bin undefined, casync picks the nearest bin: GRACE's
    ``tfp.stats.find_bins`` gives NaN for ratios outside ``[EDGES[0], EDGES[127]]`` (below ``1.5e-6``, and at or
    above ``0.9957``: so the largest element itself, whose ratio is 1), and casts that NaN to int8; casync puts
    ratios below the first edge in bin 0 (zero) and those at or above the last in bin 127.

    **Error feedback.**  Deterministic; every element decodes to its own sign and a magnitude no larger than
    its own (a lower edge), and the largest to ``0.9957 s``: contractive, plain error feedback (``ef_sound``).
    """

    name = "u8bit"
    ef_sound = True
    ignores_seed = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        codes = np.empty(n, np.int8)
        top = 0.0
        for start in range(0, n, CHUNK):
            xc = x[start:start + CHUNK]
            top = max(top, float(xc.max()), -float(xc.min()))
        s = np.float32(top)
        r = scratch("u8bit-ratio", np.float32, min(n, CHUNK))
        for start in range(0, n, CHUNK):
            xc = x[start:start + CHUNK]
            rm = r[:xc.size]
            if s > 0:
                np.abs(xc, out=rm)
                np.divide(rm, s, out=rm)
            else:
                rm.fill(0)
            bins = _bins(rm)
            negative = np.less(xc, 0).view(np.int8)  # 1 where x < 0: -bins = (bins ^ -1) + 1 there
            np.bitwise_xor(bins, -negative, out=bins)
            bins += negative  # (a masked np.negative took 90x as long)
            codes[start:start + xc.size] = bins
        return {"codes": codes, "scale": np.array([s], np.float32)}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        return self.decode_into(payload, n, None)

    def decode_into(self, payload: Payload, n: int, out: np.ndarray | None) -> np.ndarray:
        n = check_length(n)
        codes = field(payload, "codes", np.int8, (n,), self.name)
        s = field(payload, "scale", np.float32, (1,), self.name)[0]
        return np.take(_table(s), codes.view(np.uint8), out=out)

    def compressed_nbytes(self, n: int) -> int:
        return check_length(n) + 4


def _table(s: np.float32) -> np.ndarray:
    """``table[b]``: the float the code whose byte is ``b`` decodes to (codes -127..127 as uint8; 0 and -128 -> 0)."""
    magnitude = EDGES * s
    table = np.zeros(256, np.float32)
    table[1:128] = magnitude[1:]
    table[129:256] = -magnitude[:0:-1]  # byte 256 - k is code -k
    return table
