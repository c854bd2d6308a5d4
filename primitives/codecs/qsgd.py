"""``qsgd``: QSGD (Alistarh et al. 2017) — stochastic rounding to ``levels`` steps of the L2 norm."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import (
    CHUNK,
    Codec,
    Payload,
    as_input,
    block_sum,
    check_length,
    check_seed,
    field,
    int_param,
    scratch,
)

MAX_LEVELS = 2**15 - 1  # signed levels must fit in int16
_TINY = np.finfo(np.float32).tiny * 2**24


def l2_norm(x: np.ndarray) -> float:
    """``||x||_2``: float32 squares summed in float64, in a CPU-independent order (the norm is sent, and a
    float32 sum lost a norm's 7th digit beside one large square)."""
    total = 0.0
    buf = scratch("sq", np.float32, min(x.size, CHUNK))
    for start in range(0, x.size, CHUNK):
        xc = x[start : start + CHUNK]
        sq = buf[: xc.size]
        with np.errstate(over="ignore", under="ignore"):
            np.multiply(xc, xc, out=sq)
        total += float(block_sum(sq, np.float64))
    if not 1e-30 < total < 1e38:  # float32 squares may have under- or overflowed
        x64 = x.astype(np.float64)
        total = float(np.dot(x64, x64))
    return math.sqrt(total)


class QSGDCodec(Codec):
    """QSGD with ``s = levels``: ``level = floor(|x| / norm * s + u)``, ``u ~ U[0, 1)``,
    decoded as ``sign(x) * norm * level / s`` — unbiased, ``|error| <= norm / s``.

    Payload: ``levels`` int8[n] (int16[n] when s > 127) holding signed levels,
    ``norm`` float32[1].

    Its variance is ``(norm / s)^2 * sum f_i (1 - f_i)`` with ``f_i`` the fraction of ``|x_i| s / norm``: for
    large tensors ``omega`` exceeds 1 (about 6 at a million Gaussian elements, 127 levels), so plain error
    feedback is unsound.  :meth:`encode_contractive` sends the same levels with ``norm / (1 + omega)``.
    """

    name = "qsgd"
    ef_sound = False

    def __init__(self, levels: int = 127) -> None:
        self.levels = int_param(self.name, "levels", levels, 1, MAX_LEVELS)
        self._dtype = np.dtype(np.int8 if self.levels <= 127 else np.int16)

    def params(self) -> dict[str, Any]:
        return {"levels": self.levels}

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        rng = np.random.default_rng(check_seed(seed))
        with np.errstate(over="ignore"):
            norm = np.float32(l2_norm(x))
        if not np.isfinite(norm):
            raise ValueError(f"codec {self.name!r}: input is not finite or its L2 norm overflows float32")
        if norm == 0:
            return {"levels": np.zeros(n, self._dtype), "norm": np.zeros(1, np.float32)}
        out = np.empty(n, self._dtype)
        s = self.levels
        with np.errstate(over="ignore"):
            gain = np.float32(s) / norm  # inf only for subnormal norms: then divide, then scale
        c = min(n, CHUNK)
        y, u = scratch("qy", np.float32, c), scratch("qu", np.float32, c)
        sign = scratch("qsign", np.uint32, c)
        for start in range(0, n, CHUNK):
            xc = x[start : start + CHUNK]
            m = xc.size
            ym, um, sm = y[:m], u[:m], sign[:m]
            # level = sign(x) * floor(|x| * s / norm + u) = trunc(y + sign(x) * u), y = x * s / norm
            if np.isfinite(gain):
                np.multiply(xc, gain, out=ym)
            else:
                np.divide(xc, norm, out=ym)
                np.multiply(ym, np.float32(s), out=ym)
            rng.random(out=um, dtype=np.float32)
            np.bitwise_and(xc.view(np.uint32), 0x80000000, out=sm)
            np.bitwise_or(um.view(np.uint32), sm, out=um.view(np.uint32))  # u takes x's sign
            np.add(ym, um, out=ym)
            np.clip(ym, -s, s, out=ym)  # |x| / norm may round a hair above 1
            np.copyto(out[start : start + m], ym, casting="unsafe")  # float -> int truncates
        return {"levels": out, "norm": np.array([norm], np.float32)}

    def encode_contractive(self, x: np.ndarray, seed: int = 0) -> Payload:
        payload = self.encode(x, seed)
        norm = float(payload["norm"][0])
        if norm == 0:
            return payload
        x = as_input(x)
        s = self.levels
        spread = 0.0  # sum of f (1 - f), f = frac(|x| s / norm): the variance in units of (norm / s)^2
        buf = scratch("qvar", np.float32, min(x.size, CHUNK))
        for start in range(0, x.size, CHUNK):
            xc = x[start : start + CHUNK]
            y = buf[: xc.size]
            np.abs(xc, out=y)
            np.divide(y, np.float32(norm), out=y)
            np.multiply(y, np.float32(s), out=y)
            np.subtract(y, np.floor(y), out=y)
            np.multiply(y, 1 - y, out=y)
            spread += float(block_sum(y))
        payload["norm"] = np.array([norm / (1.0 + spread / (s * s))], np.float32)
        return payload

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        n = check_length(n)
        levels = field(payload, "levels", self._dtype, (n,), self.name)
        norm = field(payload, "norm", np.float32, (1,), self.name)[0]
        step = norm / np.float32(self.levels)
        if step < _TINY:  # step would lose precision as a float32 subnormal
            return (levels * (float(norm) / self.levels)).astype(np.float32)
        out = np.empty(n, np.float32)
        np.copyto(out, levels, casting="unsafe")
        np.multiply(out, step, out=out)
        return out

    def compressed_nbytes(self, n: int) -> int:
        return check_length(n) * self._dtype.itemsize + 4
