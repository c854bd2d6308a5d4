"""``dithering``: BytePS-Compress's dithering compressor with max normalization (Horvath et al. 2019, "Natural
compression for distributed deep learning", section on natural dithering): stochastic rounding of ``|x| / max|x|``
to levels that are evenly spaced (``partition="linear"``) or powers of two (``partition="natural"``).

BytePS also normalizes by the L2 norm, and then sends only the nonzero levels, Elias-delta coded: a payload
whose size is known only after encoding, which casync's plans cannot carry yet (variable-size payloads); only
max normalization, BytePS's default, is here.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import (CHUNK, Codec, Payload, as_input, block_sum, check_length, check_seed, field, int_param,
                   norms, param_error, scratch)

PARTITIONS = ("linear", "natural")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class DitheringCodec(Codec):
    """Dithering with max normalization: ``s = max|x|``, ``y = |x| / s * L``; ``y`` is rounded at random to the
    level below or above it, with the probabilities that make it unbiased, and sent signed; the level ``l``
    decodes to ``l * s / L``.

    * ``partition="linear"`` (BytePS's default): levels ``0, 1, ..., L`` with ``L = levels``; rounds ``y`` to
      ``floor(y)`` or ``floor(y) + 1``.
    * ``partition="natural"``: levels ``0, 1, 2, 4, ..., L`` with ``L = 2^(levels - 1)``; ``y`` in ``(2^j, 2^(j+1)]``
      rounds to ``2^j`` or ``2^(j+1)``, ``y`` in ``[0, 1]`` to 0 or 1.

    Payload: ``levels`` int8[n] (int16[n] when ``L`` exceeds 127), ``scale`` float32[1] (= s): n (or 2n) + 4
    bytes.  BytePS picks int8 for ``levels < 128`` whatever the partition, which overflows for natural levels
    above 7 (``2^7 = 128``); casync sizes the integer by ``L``.  Randomness comes from the plan's seed (NumPy's
    PCG64, not BytePS's xorshift128+).

    **Error feedback.**  Unbiased, with variance ``(s / L)^2 sum len_i^2 p_i (1 - p_i)`` (``len_i`` the gap between
    the two levels around ``y_i``, ``p_i`` the chance of the upper one): ``omega`` may exceed 1, so plain error
    feedback is unsound (``ef_sound = False``; BytePS's own note: L2 normalization diverges with it).
    :meth:`encode_contractive` sends the same levels with ``s / (1 + omega)``, which error feedback uses
    (``"auto"``), as for qsgd and terngrad.
    """

    name = "dithering"
    ef_sound = False

    def __init__(self, levels: int = 127, partition: str = "linear") -> None:
        if partition not in PARTITIONS:
            raise param_error(self.name, "partition", f"one of {list(PARTITIONS)}", partition)
        self.partition = partition
        self.levels = int_param(self.name, "levels", levels, 1, 2**15 - 1 if partition == "linear" else 15)
        self.top = self.levels if partition == "linear" else 1 << (self.levels - 1)
        self._dtype = np.dtype(np.int8 if self.top <= 127 else np.int16)

    def params(self) -> dict[str, Any]:
        return {"levels": self.levels, "partition": self.partition}

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        return self._encode(as_input(x), seed)[0]

    def encode_contractive(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        payload, spread = self._encode(x, seed, spread=True)
        s = float(payload["scale"][0])
        if s > 0:
            l2 = norms(x)[1]
            omega = spread * (s / self.top) ** 2 / l2 if l2 > 0 else 0.0
            payload["scale"] = np.array([s / (1.0 + omega)], np.float32)
        return payload

    def _encode(self, x: np.ndarray, seed: int, spread: bool = False) -> tuple[Payload, float]:
        """The payload, and (``spread``) ``sum len_i^2 p_i (1 - p_i)``: the variance in units of ``(s / L)^2``."""
        n = x.size
        rng = np.random.default_rng(check_seed(seed))
        top = 0.0
        for start in range(0, n, CHUNK):
            xc = x[start:start + CHUNK]
            top = max(top, float(xc.max()), -float(xc.min()))
        s = np.float32(top)
        out = np.zeros(n, self._dtype)
        total = 0.0
        if not s > 0:  # all zeros (or a NaN maximum: the nonfinite path sends those on the side)
            return {"levels": out, "scale": np.array([0 if s != s else s], np.float32)}, total
        c = min(n, CHUNK)
        y, low, gap, u = (scratch(f"dither-{k}", np.float32, c) for k in ("y", "low", "gap", "u"))
        for start in range(0, n, CHUNK):
            xc = x[start:start + CHUNK]
            m = xc.size
            ym, lm, gm, um = y[:m], low[:m], gap[:m], u[:m]
            np.abs(xc, out=ym)
            np.divide(ym, s, out=ym)
            np.multiply(ym, np.float32(self.top), out=ym)
            self._bracket(ym, lm, gm)
            np.subtract(ym, lm, out=ym)
            np.divide(ym, gm, out=ym)  # p: the chance of the upper level
            if spread:
                np.multiply(ym, 1 - ym, out=um)
                np.multiply(um, gm, out=um)
                np.multiply(um, gm, out=um)
                total += float(block_sum(um, np.float64))
            rng.random(out=um, dtype=np.float32)
            up = um < ym
            np.multiply(gm, up, out=gm)
            np.add(lm, gm, out=lm)  # the level sent
            np.copysign(lm, xc, out=lm)  # (a masked np.negative took 30x as long)
            np.copyto(out[start:start + m], lm, casting="unsafe")
        return {"levels": out, "scale": np.array([s], np.float32)}, total

    def _bracket(self, y: np.ndarray, low: np.ndarray, gap: np.ndarray) -> None:
        """The level at or below ``y`` into ``low`` and the gap to the next level into ``gap`` (float32, exact
        small integers)."""
        if self.partition == "linear":
            np.floor(y, out=low)
            np.minimum(low, self.top - 1, out=low)  # y == L rounds to L from L - 1 with probability 1
            gap.fill(1)
            return
        # natural: ceil(y) = c; the level below is 0 for c <= 1, else half the smallest power of two >= c, which is the
        # power of two at or below c - 1: c - 1 with its mantissa bits cleared (c - 1 = 0 clears to 0, -1 to -1 -> 0)
        np.ceil(y, out=gap)
        np.subtract(gap, 1, out=low)
        bits = low.view(np.uint32)
        np.bitwise_and(bits, np.uint32(0xFF800000), out=bits)
        np.maximum(low, 0, out=low)
        np.maximum(low, 1, out=gap)

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        n = check_length(n)
        levels = field(payload, "levels", self._dtype, (n,), self.name)
        s = field(payload, "scale", np.float32, (1,), self.name)[0]
        out = np.empty(n, np.float32)
        np.copyto(out, levels, casting="unsafe")
        if s <= _FLOAT32_MAX / self.top:
            np.multiply(out, s, out=out)
            np.divide(out, np.float32(self.top), out=out)  # BytePS: (level * scale) / L
        else:  # level * scale would overflow float32 (BytePS's inf): the step first
            np.multiply(out, s / np.float32(self.top), out=out)
        return out

    def compressed_nbytes(self, n: int) -> int:
        return check_length(n) * self._dtype.itemsize + 4
