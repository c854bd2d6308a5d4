"""NaN and Inf in gradients: detect them cheaply, name them, and carry them through any codec intact.

``build_plan(..., nonfinite=mode)`` chooses what the engines do when a worker's gradient is not finite:

* ``"raise"`` (default): :class:`~casync.errors.NonFiniteGradientError` naming each worker and tensor with
  its NaN/Inf counts.  Nothing is synchronized: step and error-feedback state stay as they were.
* ``"skip"``: the step is skipped on every worker alike: ``sync`` returns zeros with ``out.skipped`` True
  (and ``out.nonfinite`` the reports), error-feedback residuals are not updated, the step counter advances.
* ``"propagate"``: the values flow to every worker's result, bit-identical on every worker, at exactly the
  positions where they occurred (as an uncompressed all-reduce would put them).

Detection is one pass per worker gradient (:func:`all_finite`, about half the time of a onebit encode).
Inside a sync, a payload whose input held NaN/Inf carries those entries on the side (``nonfinite.index`` /
``nonfinite.value``) and the codec encodes the rest with them zeroed, so a codec's scale (onebit's mean
|x|, qsgd's norm, terngrad's max) never turns one Inf into garbage everywhere, and a threshold or
sparsifier never drops one silently.  Decoding puts them back; merges propagate them as float arithmetic
does; error-feedback residuals stay finite (zero where the value travelled exactly).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

MODES = ("raise", "skip", "propagate")
NF_INDEX = "nonfinite.index"  # payload side channel: positions (int64) of non-finite inputs of an encode
NF_VALUE = "nonfinite.value"  # ... and their float32 values


def check_mode(mode: Any) -> str:
    """Validate a ``nonfinite`` option."""
    if not isinstance(mode, str):
        raise TypeError(f"nonfinite must be one of {list(MODES)}, got {mode!r} ({type(mode).__name__})")
    if mode not in MODES:
        raise ValueError(f"nonfinite must be one of {list(MODES)}, got {mode!r}")
    return mode


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


@dataclass(frozen=True)
class NonFiniteReport:
    """One worker's tensor that held NaN and/or Inf, with how many of each."""

    worker: int
    tensor: str
    nan: int
    inf: int

    def __str__(self) -> str:
        return f"worker {self.worker}, tensor {self.tensor!r}: {self.nan} NaN, {self.inf} Inf"


@dataclass(frozen=True)
class BucketLayout:
    """Where tensors and partitions sit in a bucket's flat buffer: enough to name what a scan finds."""

    name: str
    tensors: tuple[str, ...]
    tensor_stops: tuple[int, ...]  # end offset of each member in the flat buffer
    part_stops: tuple[int, ...]  # end offset of each partition


def layouts(plan: Any) -> list[BucketLayout]:
    """The plan's buckets as :class:`BucketLayout` (plain data, cheap to ship to actors)."""
    return [BucketLayout(b.name, tuple(m.spec.name for m in b.members), tuple(m.stop for m in b.members),
                         tuple(stop for _, stop in b.partitions)) for b in plan.buckets]


def scan_worker(bucket_layouts: list[BucketLayout], worker: int, buffers: Mapping[str, np.ndarray]
                ) -> tuple[list[NonFiniteReport], set[tuple[str, int]]]:
    """Check one worker's flat bucket buffers: reports per offending tensor, and the (bucket, partition)
    pairs that hold non-finite values (the encodes that must carry them on the side)."""
    reports: list[NonFiniteReport] = []
    parts: set[tuple[str, int]] = set()
    for layout in bucket_layouts:
        flat = buffers.get(layout.name)
        if flat is None or all_finite(flat):
            continue
        where = nonfinite_positions(flat)
        nan = np.isnan(flat[where])
        member = np.searchsorted(layout.tensor_stops, where, side="right")
        for index in np.unique(member):
            mask = member == index
            n_nan = int(np.count_nonzero(nan[mask]))
            reports.append(NonFiniteReport(worker, layout.tensors[index], n_nan, int(np.count_nonzero(mask)) - n_nan))
        parts.update((layout.name, int(p)) for p in np.unique(np.searchsorted(layout.part_stops, where, side="right")))
    return reports, parts


class SyncOutput(list):
    """What ``sync`` returns: one mapping per worker (a list), plus what happened to non-finite values.

    ``skipped`` is True when the plan's ``nonfinite="skip"`` voided this step (every result is zero);
    ``nonfinite`` lists the :class:`NonFiniteReport` of the step (empty when all gradients were finite).
    """

    def __init__(self, results: Any = (), skipped: bool = False, nonfinite: list[NonFiniteReport] | None = None):
        super().__init__(results)
        self.skipped = skipped
        self.nonfinite = list(nonfinite or [])


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
    if index.ndim != 1 or index.shape != values.shape or (index.size and not 0 <= index[0] <= index[-1] < dense.size):
        raise ValueError(f"malformed non-finite side channel: {index.shape} positions, {values.shape} values "
                         f"for {dense.size} elements")
    dense[index] = values
    return dense
