"""onebit's encode sweep in one pass over memory: the C kernel of ``_sign_sweep.c``, where it was built and the CPU
has AVX2, bit for bit the NumPy sweep of :mod:`primitives.codecs.sign`.

The NumPy sweep makes about nine passes over each cache-sized block (decode the incoming payload, add it, decode
the deferred residual's payload, subtract, add, compare, pack, abs, lane sums); the kernel makes one, with the same
float32 operations in the same order, and releases the GIL while it runs.  It takes the common inputs: an array,
or a ring hop's pending merge of an array and one onebit payload; no residual, an array residual or a deferred
onebit one.  Anything else (other merges, a non-finite scale, a block of fewer than 128 floats, no kernel) runs
the NumPy sweep, which stays the reference.  ``CASYNC_SIGN_KERNEL=0`` turns the kernel off.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from .base import field, scratch
from .residual import DeferredResidual

try:  # built by setup.py where a C compiler is there (optional)
    from ._sign_sweep import available as _cpu_runs_kernel, sweep as _kernel_sweep
except ImportError:  # pragma: no cover - depends on the build
    _cpu_runs_kernel = _kernel_sweep = None

_EMPTY_F = np.empty(0, np.float32)
_EMPTY_B = np.empty(0, np.uint8)


def available() -> bool:
    """Whether the kernel is built, this CPU runs it, and ``CASYNC_SIGN_KERNEL`` does not turn it off."""
    return (_cpu_runs_kernel is not None and _cpu_runs_kernel()
            and os.environ.get("CASYNC_SIGN_KERNEL", "1") not in ("0", "false", "no", "off"))


class FusedSweep:
    """The inputs of one onebit sweep bound to the kernel: :meth:`block` runs it over most of a block."""

    __slots__ = ("x", "incoming", "incoming_scale", "divisor", "kind", "addend", "residual_bits", "residual_scale")

    def __init__(self, x: np.ndarray, incoming: np.ndarray | None, incoming_scale: float, divisor: int,
                 addend: np.ndarray | DeferredResidual | None):
        self.x, self.incoming, self.incoming_scale, self.divisor = x, incoming, incoming_scale, float(divisor)
        if addend is None:
            self.kind, self.addend, self.residual_bits, self.residual_scale = 0, _EMPTY_F, _EMPTY_B, 0.0
        elif isinstance(addend, DeferredResidual):
            self.kind, self.addend = 2, addend.corrected
            self.residual_bits, self.residual_scale = addend.payload["bits"], float(addend.payload["scale"][0])
        else:
            self.kind, self.addend, self.residual_bits, self.residual_scale = 1, addend, _EMPTY_B, 0.0

    def block(self, start: int, stop: int, out: np.ndarray | None, bits: np.ndarray) -> tuple[np.ndarray | None, int]:
        """Run the kernel over ``[start, cut)``, the block's first ``(stop - start) & ~63`` elements: ``out`` (when
        given) and ``bits`` written there.  Returns ``(lanes, cut)``: :func:`~primitives.codecs.base.block_sum`'s 64-row
        lane sums of ``|v|`` over that part, for the caller to add pairwise with the tail ``[cut, stop)`` it computes
        itself; ``(None, start)`` where the block is too short (a single lane column NumPy sums in another order)."""
        m = (stop - start) & ~63
        if m < 128:
            return None, start
        cut, lanes = start + m, m // 64
        b0, b1 = start >> 3, cut >> 3
        out_lanes = scratch("kernel lanes", np.float32, lanes)
        _kernel_sweep(
            self.x[start:cut], self.incoming[b0:b1] if self.incoming is not None else _EMPTY_B,
            self.incoming_scale, self.divisor, self.kind, self.addend[start:cut] if self.kind else _EMPTY_F,
            self.residual_bits[b0:b1] if self.kind == 2 else _EMPTY_B, self.residual_scale,
            out[start:cut] if out is not None else _EMPTY_F, bits[b0:b1],
            out_lanes, scratch("kernel magnitudes", np.float32, m) if lanes % 8 else _EMPTY_F)
        return out_lanes, cut


def bind(x: Any, addend: Any, onebit: type) -> FusedSweep | None:
    """A :class:`FusedSweep` for these inputs of ``onebit``'s sweep (``x``: an array or a pending merge; ``addend``:
    None, an array or a deferred residual), or None where the kernel cannot take them."""
    if not available():
        return None
    if isinstance(x, np.ndarray):
        array, incoming, scale, divisor = x, None, 0.0, 1
    else:
        array, incoming, scale, divisor = _hop_merge(x, onebit)
        if array is None:
            return None
    if not _dense(array) or (addend is None and incoming is not None):
        return None
    if addend is not None:
        if isinstance(addend, DeferredResidual):
            if not (isinstance(addend.codec, onebit) and _dense(addend.corrected) and addend.size == array.size
                    and _finite(addend.payload, addend.size, addend.codec)):
                return None
        elif not (_dense(addend) and addend.size == array.size):
            return None
    return FusedSweep(array, incoming, scale, divisor, addend)


def _hop_merge(x: Any, onebit: type) -> tuple[Any, Any, float, int]:
    """``(array, payload bits, payload scale, divisor)`` of a pending merge of one array and one onebit payload with
    a finite scale (in either order: IEEE addition is commutative), else ``(None, ...)``."""
    inputs = getattr(x, "inputs", ())
    if len(inputs) != 2:
        return None, None, 0.0, 1
    array = next((i for i in inputs if isinstance(i, np.ndarray)), None)
    deferred = next((i for i in inputs if not isinstance(i, np.ndarray)), None)
    if (array is None or deferred is None or not hasattr(deferred, "payload")
            or not isinstance(getattr(deferred, "codec", None), onebit) or deferred.n != array.size
            or not _finite(deferred.payload, deferred.n, deferred.codec)):
        return None, None, 0.0, 1
    return array, deferred.payload["bits"], float(deferred.payload["scale"][0]), x.divisor


def _dense(a: Any) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 1 and a.flags.c_contiguous


def _finite(payload: Any, n: int, codec: Any) -> bool:
    """Whether a onebit payload of ``n`` elements has a finite scale; its fields checked as its decode checks them
    (a malformed payload raises the same error here as on the NumPy path)."""
    field(payload, "bits", np.uint8, ((n + 7) // 8,), codec.name)
    return bool(np.isfinite(field(payload, "scale", np.float32, (1,), codec.name)[0]))
