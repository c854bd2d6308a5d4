"""GRACE's sign compressors beside casync's ``onebit``: ``signsgd`` (a majority vote of bare signs) and ``onebit2``
(GRACE's onebit: one sign bit per element and two scales, the mean of the negative and of the other elements).

GRACE's ``efsignsgd`` is casync's ``onebit`` (``casync.primitives.codecs.ALIASES``): its payload is the sign of
``x >= 0`` and ``mean(|x|)`` and decodes to ``+-mean(|x|)``, which is onebit's (``tests/primitives/test_grace_codecs.py``
shows them equal).  Its memory adds the residual to ``lr * g`` and its aggregate divides the sum by ``lr``: both
scalings cancel through the positively homogeneous codec at a constant learning rate, which is casync's plain
error feedback.
"""
from __future__ import annotations

import numpy as np

from .base import BLOCK, Payload, as_input, block_sum, check_length, expand_packed, field, scratch
from .blocks import BlockDecoder
from .sign import _BITS

#: ``_SIGNS[b]``: the 8 floats byte ``b`` of a signsgd payload decodes to (bit 1: -1.0, bit 0: +1.0).
_SIGNS = np.where(_BITS, np.float32(-1), np.float32(1)).astype(np.float32)
_SIGNS.flags.writeable = False


def negative_bits(x: np.ndarray, out: np.ndarray) -> None:
    """Pack ``not (x >= 0)`` (GRACE's sign test: NaN counts as negative) into ``out`` (uint8, ceil(n/8)), block by
    block through a scratch mask."""
    n = x.size
    mask = scratch("signs-mask", np.bool_, min(n, BLOCK))
    for start in range(0, n, BLOCK):  # BLOCK is a multiple of 8: every block starts on a packed byte
        m = min(BLOCK, n - start)
        b = mask[:m]
        np.greater_equal(x[start:start + m], 0, out=b)
        np.logical_not(b, out=b)
        out[start >> 3:(start + m + 7) >> 3] = np.packbits(b)


class SignSGDCodec(BlockDecoder):
    """signSGD with majority vote (Bernstein et al. 2018), as GRACE defines it: each worker sends the sign of
    ``x >= 0`` (zero counts as positive), each decodes to +1 or -1 with no scale, and the aggregate is the sign
    of their sum (a tie is +1): the majority vote, not a mean.

    Payload: ``bits`` uint8[ceil(n/8)] (``np.packbits`` order, 1 where ``x`` is negative or NaN); n/8 bytes, no
    scale (a 32x ratio).

    **Where it is exact.**  The vote of every worker's sign is computed where one merge takes all N workers'
    encoded signs and nothing else, and the merged tensor (the mean of N signs) is encoded again with this codec,
    whose sign test is the vote (a mean of exactly 0 is a tie: +1): PS with dedicated servers and two-way
    (``strategy="ps", servers=S``).  Ring re-encodes partial sums at every hop (a vote of votes is not the vote of
    all) and merges raw local chunks, co-located PS merges the host's raw gradient, one-way PS and all-gather
    return the mean of the signs without the vote: ``casync.plan.lint`` refuses those plans, naming the strategy
    (:data:`Codec.votes`).

    **Error feedback.**  Not contractive (``||x - sign(x)||`` exceeds ``||x||`` wherever ``|x| < 1/2`` on average),
    and a vote has no residual to carry: ``ef_sound = False``, no contractive version, so ``"auto"`` runs it
    without error feedback and ``True`` is refused, as GRACE runs it (no memory).
    """

    name = "signsgd"
    ef_sound = False
    votes = True
    ignores_seed = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        bits = np.empty((x.size + 7) // 8, np.uint8)
        negative_bits(x, bits)
        return {"bits": bits}

    def _decode(self, payload: Payload, n: int, start: int, stop: int | None, out: np.ndarray | None) -> np.ndarray:
        n = check_length(n)
        stop = n if stop is None else stop
        bits = field(payload, "bits", np.uint8, ((n + 7) // 8,), self.name)
        return expand_packed(_SIGNS, bits[start >> 3:(stop + 7) >> 3], stop - start, out=out)

    def compressed_nbytes(self, n: int) -> int:
        return (check_length(n) + 7) // 8


class TwoScaleOneBitCodec(BlockDecoder):
    """GRACE's onebit (Seide et al. 2014, 1-bit SGD): a sign bit per element (1 where ``x < 0``) and two scales,
    the mean of the negative elements and the mean of the others; each element decodes to its group's mean.

    Payload: ``bits`` uint8[ceil(n/8)], ``scales`` float32[2] = (mean of ``x < 0``, mean of ``x >= 0``); a group
    with no element has scale 0 (GRACE divides its sum, 0, by 1).  The means are summed in float64 in a fixed,
    CPU-independent order (GRACE sums in float32).

    Differs from casync's ``onebit`` (one scale, ``mean(|x|)``, so ``+-mean(|x|)``): each group keeps its own
    mean, so the decoded tensor keeps ``sum(x)`` exactly.  It is an orthogonal projection of ``x`` onto the
    two-valued vectors of its sign pattern, so ``||x - C(x)||^2 = ||x||^2 - n0 m0^2 - n1 m1^2``: contractive for
    every nonzero ``x`` (the negative group's mean is negative, the other's positive unless all its elements are
    zero); plain error feedback (``ef_sound``), as GRACE pairs it with its residual memory.
    """

    name = "onebit2"
    ef_sound = True
    ignores_seed = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        bits = np.empty((n + 7) // 8, np.uint8)
        mask = scratch("onebit2-mask", np.bool_, min(n, BLOCK))
        part = scratch("onebit2-part", np.float32, min(n, BLOCK))
        neg_sum = pos_sum = 0.0
        negatives = 0
        for start in range(0, n, BLOCK):
            m = min(BLOCK, n - start)
            xc, b, t = x[start:start + m], mask[:m], part[:m]
            np.less(xc, 0, out=b)
            bits[start >> 3:(start + m + 7) >> 3] = np.packbits(b)
            negatives += int(np.count_nonzero(b))
            np.minimum(xc, 0, out=t)  # -0.0 and the non-negative elements add nothing
            neg_sum += float(block_sum(t, np.float64))
            np.subtract(xc, t, out=t)  # x - min(x, 0) = max(x, 0): the other group (NaN stays NaN)
            pos_sum += float(block_sum(t, np.float64))
        others = n - negatives
        scales = np.array([neg_sum / negatives if negatives else 0.0, pos_sum / others if others else 0.0])
        with np.errstate(over="ignore", invalid="ignore"):
            return {"bits": bits, "scales": scales.astype(np.float32)}

    def _decode(self, payload: Payload, n: int, start: int, stop: int | None, out: np.ndarray | None) -> np.ndarray:
        n = check_length(n)
        stop = n if stop is None else stop
        bits = field(payload, "bits", np.uint8, ((n + 7) // 8,), self.name)
        neg, pos = field(payload, "scales", np.float32, (2,), self.name)
        table = np.where(_BITS, neg, pos).astype(np.float32)
        return expand_packed(table, bits[start >> 3:(stop + 7) >> 3], stop - start, out=out)

    def compressed_nbytes(self, n: int) -> int:
        return (check_length(n) + 7) // 8 + 8
