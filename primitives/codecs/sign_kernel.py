"""onebit's encode sweep, and merges of its payloads, in one pass over memory: the C kernel of ``_sign_sweep.c``,
where it was built and the CPU has AVX2, bit for bit the NumPy code of :mod:`casync.primitives.codecs.sign` and
:mod:`casync.primitives.merge`.

The NumPy sweep makes about nine passes over each cache-sized block (decode the incoming payload, add it, decode
the deferred residual's payload, subtract, add, compare, pack, abs, lane sums); the kernel makes one, with the same
float32 operations in the same order, and releases the GIL while it runs a block of :data:`GIL_FREE_MIN` floats
or more (a smaller one keeps it: where a rank's other threads wait for the GIL, taking it back after a few
microseconds of work can cost more than the work).  It takes the inputs onebit's encodes
get: an array, or a pending merge of at most one array and onebit payloads (a ring hop's, a parameter server's);
no residual, an array residual or a deferred onebit one.  Anything else (sparse or other codecs' inputs, two
arrays, a non-finite scale, a block of fewer than 128 floats, no kernel) runs the NumPy sweep, which stays the
reference.  A merge of payloads alone (an all-gather's) takes the same terms (``Codec.fused_merge``), and a small
decode is a merge of one payload (:func:`decode_small`).  ``CASYNC_SIGN_KERNEL=0`` turns the kernel off.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from .base import field, scratch
from .residual import DeferredResidual

try:  # built by setup.py where a C compiler is there (optional)
    from ._sign_sweep import MAX_TERMS
    from ._sign_sweep import available as _cpu_runs_kernel, merge as _kernel_merge, sweep as _kernel_sweep
except ImportError:  # pragma: no cover - depends on the build
    _cpu_runs_kernel = _kernel_merge = _kernel_sweep = None
    MAX_TERMS = 0  # terms the kernel adds at most (a server's merge of more workers' payloads runs NumPy's)
try:  # blocks of fewer floats run in the kernel holding the GIL
    from ._sign_sweep import GIL_FREE_MIN
except ImportError:  # pragma: no cover - no kernel, or one built before it kept the GIL
    GIL_FREE_MIN = 0

_EMPTY_F = np.empty(0, np.float32)
_EMPTY_B = np.empty(0, np.uint8)


def available() -> bool:
    """Whether the kernel is built, this CPU runs it, and ``CASYNC_SIGN_KERNEL`` does not turn it off."""
    return (_cpu_runs_kernel is not None and _cpu_runs_kernel()
            and os.environ.get("CASYNC_SIGN_KERNEL", "1") not in ("0", "false", "no", "off"))


class FusedSweep:
    """The inputs of one onebit sweep bound to the kernel: :meth:`block` runs it over most of a block."""

    __slots__ = ("terms", "array_at", "scales", "divisor", "kind", "addend", "residual_bits", "residual_scale")

    def __init__(self, terms: list[np.ndarray], array_at: int, scales: list[float], divisor: int,
                 addend: np.ndarray | DeferredResidual | None):
        self.terms, self.array_at, self.scales, self.divisor = terms, array_at, tuple(scales), float(divisor)
        if addend is None:
            self.kind, self.addend, self.residual_bits, self.residual_scale = 0, _EMPTY_F, _EMPTY_B, 0.0
        elif isinstance(addend, DeferredResidual):
            self.kind, self.addend = 2, addend.corrected
            self.residual_bits, self.residual_scale = addend.payload["bits"], float(addend.payload["scale"][0])
        else:
            self.kind, self.addend, self.residual_bits, self.residual_scale = 1, addend, _EMPTY_B, 0.0

    def block(self, start: int, stop: int, out: np.ndarray | None, bits: np.ndarray) -> tuple[np.ndarray | None, int]:
        """Run the kernel over ``[start, cut)``, the block's first ``(stop - start) & ~63`` elements: ``out`` (when
        given) and ``bits`` written there.  Returns ``(lanes, cut)``:
        :func:`~casync.primitives.codecs.base.block_sum`'s 64-row lane sums of ``|v|`` over that part, for the
        caller to add pairwise with the tail ``[cut, stop)`` it computes itself; ``(None, start)`` where the block is
        too short (a single lane column NumPy sums in another order)."""
        m = (stop - start) & ~63
        if m < 128:
            return None, start
        cut, lanes = start + m, m // 64
        b0, b1 = start >> 3, cut >> 3
        terms = _block_of(self.terms, self.array_at, start, cut)
        out_lanes = scratch("kernel lanes", np.float32, lanes)
        _kernel_sweep(terms, self.array_at, self.scales, self.divisor, self.kind,
                      self.addend[start:cut] if self.kind else _EMPTY_F,
                      self.residual_bits[b0:b1] if self.kind == 2 else _EMPTY_B, self.residual_scale,
                      out[start:cut] if out is not None else _EMPTY_F, bits[b0:b1],
                      out_lanes, scratch("kernel magnitudes", np.float32, m) if lanes % 8 else _EMPTY_F)
        return out_lanes, cut


def bind(x: Any, addend: Any, out: np.ndarray | None, onebit: type) -> FusedSweep | None:
    """A :class:`FusedSweep` for these inputs of ``onebit``'s sweep (``x``: an array or a pending merge of at most
    one array and onebit payloads; ``addend``: None, an array or a deferred onebit residual; ``out``: where the
    corrected input goes), or None where the kernel cannot take them."""
    if not available() or (out is not None and not _dense(out)):
        return None
    if isinstance(x, np.ndarray):
        inputs, divisor = (x,), 1
    elif addend is not None:
        inputs, divisor = tuple(getattr(x, "inputs", ())), x.divisor
    else:
        return None
    n = x.size
    merged = _terms(inputs, n, onebit)
    if merged is None:
        return None
    if addend is not None:
        if isinstance(addend, DeferredResidual):
            if not (isinstance(addend.codec, onebit) and _dense(addend.corrected) and addend.size == n
                    and _finite(addend.payload, n, addend.codec)):
                return None
        elif not (_dense(addend) and addend.size == n):
            return None
    return FusedSweep(*merged, divisor, addend)


class FusedMerge:
    """A merge of onebit payloads (and at most one array) bound to the kernel: :meth:`block` runs it."""

    __slots__ = ("terms", "array_at", "scales", "divisor")

    def __init__(self, terms: list[np.ndarray], array_at: int, scales: list[float], divisor: int):
        self.terms, self.array_at, self.scales, self.divisor = terms, array_at, tuple(scales), float(divisor)

    def block(self, start: int, stop: int, out: np.ndarray) -> int:
        """Write the merge's elements ``[start, cut)`` into ``out`` (``cut``: ``stop`` less ``(stop - start) % 8``)
        and return ``cut`` (``start`` where ``out`` is not a contiguous float32 array); the caller merges
        ``[cut, stop)`` itself."""
        cut = start + ((stop - start) & ~7)
        if cut == start or not (out.flags.c_contiguous and out.dtype == np.float32):
            return start
        _kernel_merge(_block_of(self.terms, self.array_at, start, cut), self.array_at, self.scales, self.divisor,
                      out[start:cut])
        return cut


def decode_small(packed: np.ndarray, scale: float, m: int, out: np.ndarray) -> int:
    """Decode the first ``m & ~7`` of ``m`` elements of ``packed`` (onebit's bits) into ``out``, as a merge of one
    payload, where ``m`` is under :data:`GIL_FREE_MIN` (the kernel then keeps the GIL; no lookup table to build),
    the kernel runs, ``scale`` is finite and ``out`` a contiguous float32 array; returns how many it wrote (0:
    none, the caller decodes them).  Larger decodes go through NumPy's table, which is as fast there."""
    cut = m & ~7
    if not (0 < cut and m < GIL_FREE_MIN and available() and np.isfinite(scale) and _dense(out)):
        return 0
    _kernel_merge((packed[: cut >> 3],), -1, (float(scale),), 1.0, out[:cut])
    return cut


def bind_merge(inputs: Any, divisor: int, onebit: type) -> FusedMerge | None:
    """A :class:`FusedMerge` of a merge's ``inputs`` (arrays and ``casync.primitives.merge.Deferred`` decodes), or None
    where the kernel cannot take them."""
    if not available() or not inputs:
        return None
    merged = _terms(tuple(inputs), inputs[0].size if isinstance(inputs[0], np.ndarray) else inputs[0].n, onebit)
    return None if merged is None else FusedMerge(*merged, divisor)


def _terms(inputs: tuple, n: int, onebit: type) -> tuple[list[np.ndarray], int, list[float]] | None:
    """``(terms, array_at, scales)`` of a merge's inputs the kernel can add (at most one float32 array, the rest
    onebit payloads of ``n`` elements with finite scales), or None."""
    if not 1 <= len(inputs) <= MAX_TERMS:
        return None
    terms, scales, array_at = [], [], -1
    for i, term in enumerate(inputs):
        if isinstance(term, np.ndarray):  # at most one array: NaN + NaN between two arrays is NumPy's to pick
            if array_at >= 0 or not _dense(term) or term.size != n:
                return None
            array_at = i
            terms.append(term)
            scales.append(0.0)
        elif isinstance(getattr(term, "codec", None), onebit) and hasattr(term, "payload") and term.n == n:
            if not _finite(term.payload, n, term.codec):
                return None
            terms.append(term.payload["bits"])
            scales.append(float(term.payload["scale"][0]))
        else:
            return None
    return terms, array_at, scales


def _block_of(terms: list[np.ndarray], array_at: int, start: int, cut: int) -> tuple[np.ndarray, ...]:
    """The terms' parts for elements ``[start, cut)`` (both multiples of 8): the array's floats, the payloads' bytes."""
    return tuple(t[start:cut] if i == array_at else t[start >> 3 : cut >> 3] for i, t in enumerate(terms))


def _dense(a: Any) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 1 and a.flags.c_contiguous


def _finite(payload: Any, n: int, codec: Any) -> bool:
    """Whether a onebit payload of ``n`` elements has a finite scale; its fields checked as its decode checks them
    (a malformed payload raises the same error here as on the NumPy path)."""
    field(payload, "bits", np.uint8, ((n + 7) // 8,), codec.name)
    return bool(np.isfinite(field(payload, "scale", np.float32, (1,), codec.name)[0]))
