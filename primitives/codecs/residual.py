"""An error-feedback residual whose decoded payload is still to be subtracted: ``corrected - decode(payload)``.

An error-feedback encode writes the corrected input (``x + residual``), encodes it, and then makes a second pass
that reads and rewrites the whole tensor to subtract the payload's decode; the next step reads that residual back
to add it.  A codec with ``Codec.defers_residual`` skips the second pass: it keeps the corrected tensor and the
payload, and the next step's encode computes the residual block by block, in cache, as it adds it (the same
subtraction, so the same floats).  On a core that streams memory slowly this takes two of an error-feedback
encode's five tensor-sized memory streams away.  Whatever else reads the residual (a checkpoint, a rollback, a
codec that cannot take it) calls :meth:`DeferredResidual.materialize`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import BLOCK, Codec, Payload


class DeferredResidual:
    """``corrected - codec.decode(payload)``, not yet computed.  ``codec`` decodes in blocks
    (``decodes_in_blocks``); neither ``corrected`` nor ``payload`` is written again while this is held."""

    __slots__ = ("corrected", "codec", "payload")

    def __init__(self, corrected: np.ndarray, codec: Codec, payload: Payload):
        self.corrected, self.codec, self.payload = corrected, codec, payload

    @property
    def size(self) -> int:
        return self.corrected.size

    @property
    def shape(self) -> tuple[int, ...]:
        return self.corrected.shape

    @property
    def dtype(self) -> np.dtype:
        return self.corrected.dtype

    def into(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Elements ``start:stop`` of the residual (``start`` a multiple of :data:`BLOCK`), written into ``out``."""
        decoded = self.codec.decode_block(self.payload, self.size, start, stop, out)
        return np.subtract(self.corrected[start:stop], decoded, out=decoded)

    def materialize(self, out: np.ndarray | None = None) -> np.ndarray:
        """The residual as an array: ``out`` (float32, its length, not sharing memory with ``corrected``) or a fresh
        one."""
        n = self.size
        out = np.empty(n, np.float32) if out is None else out
        for start in range(0, n, BLOCK):
            self.into(start, min(n, start + BLOCK), out[start : start + BLOCK])
        return out

    def __repr__(self) -> str:
        return f"DeferredResidual({self.size} floats, {self.codec})"


def materialized(residual: Any) -> Any:
    """``residual`` as an array: a :class:`DeferredResidual` materialized, anything else as it is."""
    return residual.materialize() if isinstance(residual, DeferredResidual) else residual


def buffer_of(residual: Any) -> Any:
    """The array a residual holds memory in: a deferred one's corrected tensor, an array itself."""
    return residual.corrected if isinstance(residual, DeferredResidual) else residual
