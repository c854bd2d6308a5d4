"""NaN and Inf in one worker's data: detect them cheaply, and carry them through any codec intact.

Inside a sync, a payload whose input held NaN/Inf carries those entries on the side (``nonfinite.index`` /
``nonfinite.value``) and the codec encodes the rest with them zeroed, so a codec's scale (onebit's mean
|x|, qsgd's norm, terngrad's max) never turns one Inf into garbage everywhere, and a threshold or
sparsifier never drops one silently.  Decoding puts them back.  What an engine *does* about non-finite
gradients (raise, skip, propagate) is a policy a layer above (``casync.engines.nonfinite``).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

NF_INDEX = "nonfinite.index"  # payload side channel: positions (int64) of non-finite inputs of an encode
NF_VALUE = "nonfinite.value"  # ... and their float32 values


def all_finite(x: np.ndarray) -> bool:
    """True when ``x`` holds no NaN or Inf.

    One summing pass: 64 rows added element-wise (vectorised, no temporary the size of ``x``), where a NaN or
    Inf makes its lane non-finite; then a look at the n/64 lane sums.  Only when a lane is not finite (a
    NaN/Inf, or finite values whose sum overflows) an exact second pass decides.  Measured at about 0.4x a
    onebit encode of the same array (benchmarks/nonfinite_overhead.py).
    """
    m = x.size & ~63
    with np.errstate(over="ignore", invalid="ignore"):
        lanes = np.add.reduce(x[:m].reshape(64, -1), axis=0) if m else x[:0]
        if np.isfinite(lanes).all() and np.isfinite(x[m:]).all():
            return True
    return bool(np.isfinite(x).all())


def nonfinite_positions(x: np.ndarray) -> np.ndarray:
    """Indices (ascending int64) of the NaN/Inf elements of a 1-D array."""
    return np.flatnonzero(~np.isfinite(x)).astype(np.int64, copy=False)


# -- the kernels' side channel ----------------------------------------------------------------------------
def split_nonfinite(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """None when ``x`` is finite; else (a copy of ``x`` with NaN/Inf zeroed, their positions, their values)."""
    if all_finite(x):
        return None
    index = nonfinite_positions(x)
    values = x[index]
    clean = x.copy()
    clean[index] = 0
    return clean, index, values


def attach(payload: dict[str, np.ndarray], index: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    """The payload with the non-finite entries riding along (a new dict; the codec's arrays are shared)."""
    return {**payload, NF_INDEX: index, NF_VALUE: values}


def carries_nonfinite(payload: Any) -> bool:
    return isinstance(payload, dict) and NF_INDEX in payload


def restore(dense: np.ndarray, payload: Mapping[str, np.ndarray]) -> np.ndarray:
    """Write the side channel's NaN/Inf back into a decoded (fresh, writable) array."""
    index, values = payload[NF_INDEX], payload[NF_VALUE]
    if (not isinstance(index, np.ndarray) or not isinstance(values, np.ndarray) or index.dtype.kind not in "iu"
            or index.ndim != 1 or index.shape != values.shape
            or (index.size and not (0 <= index[0] and index[-1] < dense.size
                                    and (index.size == 1 or bool((index[1:] > index[:-1]).all()))))):
        raise ValueError(f"malformed non-finite side channel: {np.shape(index)} positions, {np.shape(values)} values "
                         f"for {dense.size} elements")
    dense[index] = values
    return dense
