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
    check_length,
    check_seed,
    field,
    int_param,
    scratch,
)
from .sign import block_sum

MAX_LEVELS = 2**15 - 1  # signed levels must fit in int16


def l2_norm(x: np.ndarray) -> float:
    """``||x||_2`` accumulated in float64 over float32 blocks, in a CPU-independent order."""
    total = 0.0
    buf = scratch("sq", np.float32, min(x.size, CHUNK))
    for start in range(0, x.size, CHUNK):
        xc = x[start : start + CHUNK]
        sq = buf[: xc.size]
        np.multiply(xc, xc, out=sq)
        total += float(block_sum(sq))
    if not math.isfinite(total):  # float32 squares overflowed: redo in float64
        total = float(np.dot(x.astype(np.float64), x.astype(np.float64)))
    return math.sqrt(total)


class QSGDCodec(Codec):
    """QSGD with ``s = levels``: ``level = floor(|x| / norm * s + u)``, ``u ~ U[0, 1)``,
    decoded as ``sign(x) * norm * level / s`` — unbiased, ``|error| <= norm / s``.

    Payload: ``levels`` int8[n] (int16[n] when s > 127) holding signed levels,
    ``norm`` float32[1].
    """

    name = "qsgd"

    def __init__(self, levels: int = 127) -> None:
        self.levels = int_param(self.name, "levels", levels, 1, MAX_LEVELS)
        self._dtype = np.dtype(np.int8 if self.levels <= 127 else np.int16)

    def params(self) -> dict[str, Any]:
        return {"levels": self.levels}

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        n = x.size
        rng = np.random.default_rng(check_seed(seed))
        norm = np.float32(l2_norm(x))
        out = np.zeros(n, self._dtype)
        if norm == 0 or not np.isfinite(norm):
            return {"levels": out, "norm": np.array([norm if n else 0], np.float32)}
        s = self.levels
        gain = np.float32(s) / norm
        c = min(n, CHUNK)
        a, u = scratch("qa", np.float32, c), scratch("qu", np.float32, c)
        lv, neg = scratch("qlv", np.int32, c), scratch("qneg", np.bool_, c)
        for start in range(0, n, CHUNK):
            xc = x[start : start + CHUNK]
            m = xc.size
            am, um, lm, nm = a[:m], u[:m], lv[:m], neg[:m]
            np.abs(xc, out=am)
            np.multiply(am, gain, out=am)
            rng.random(out=um, dtype=np.float32)
            np.add(am, um, out=am)
            np.copyto(lm, am, casting="unsafe")  # truncation == floor, since am >= 0
            np.minimum(lm, s, out=lm)  # |x| / norm may round a hair above 1
            np.less(xc, 0, out=nm)
            np.negative(lm, out=lm, where=nm)
            np.copyto(out[start : start + m], lm, casting="unsafe")
        return {"levels": out, "norm": np.array([norm], np.float32)}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        n = check_length(n)
        levels = field(payload, "levels", self._dtype, (n,), self.name)
        norm = field(payload, "norm", np.float32, (1,), self.name)[0]
        out = np.empty(n, np.float32)
        np.copyto(out, levels, casting="unsafe")
        np.multiply(out, norm / np.float32(self.levels), out=out)
        return out

    def compressed_nbytes(self, n: int) -> int:
        return check_length(n) * self._dtype.itemsize + 4
