"""The codec contract: 1-D float32 in, a payload of NumPy arrays out, and back.

Payloads are plain ``dict[str, np.ndarray]`` so they move zero-copy through
Ray's object store and their wire size is simply the sum of ``nbytes``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

Payload = dict[str, np.ndarray]


def payload_nbytes(payload: Payload) -> int:
    """Bytes a payload occupies on the wire (sum of its arrays' buffers)."""
    return int(sum(a.nbytes for a in payload.values()))


class Codec(ABC):
    """A gradient compressor.

    Subclasses set ``name`` (the registry key), ``lossless`` and ``sparse``, and
    implement :meth:`encode`, :meth:`decode` and :meth:`compressed_nbytes`.

    Contract every codec honours (tested for all registered codecs):

    * ``encode(x, seed)`` takes a contiguous 1-D ``float32`` array of any length
      (0 included), never mutates it, and returns a payload made only of NumPy
      arrays.  All randomness comes from ``seed`` (same seed, same payload).
    * ``decode(payload, n)`` returns a fresh, writable 1-D ``float32`` array of
      length ``n``.  It needs nothing but the payload and ``n``: a codec whose
      decoder needs the seed (e.g. random-k indices) puts it in the payload.
    * ``payload_nbytes(encode(x, s)) == compressed_nbytes(len(x))`` exactly.
    """

    name: ClassVar[str] = ""
    lossless: ClassVar[bool] = False
    sparse: ClassVar[bool] = False

    @abstractmethod
    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        """Compress ``x`` (1-D float32) into a payload of NumPy arrays."""

    @abstractmethod
    def decode(self, payload: Payload, n: int) -> np.ndarray:
        """Rebuild a dense float32 array of length ``n`` from ``payload``."""

    @abstractmethod
    def compressed_nbytes(self, n: int) -> int:
        """Exact wire size in bytes of the payload for ``n`` elements."""

    # -- conveniences shared by all codecs ---------------------------------
    def params(self) -> dict[str, Any]:
        """Constructor parameters, so ``type(c)(**c.params())`` rebuilds ``c``."""
        return {}

    def ratio(self, n: int) -> float:
        """Compression ratio for ``n`` elements: float32 bytes / wire bytes."""
        wire = self.compressed_nbytes(n)
        return (4 * n) / wire if wire else float("inf")

    def spec(self) -> tuple[str, dict[str, Any]]:
        """``(name, params)``: plain data that :func:`get_codec` turns back into this codec."""
        return (self.name, self.params())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __str__(self) -> str:
        p = self.params()
        if not p:
            return self.name
        return f"{self.name}(" + ",".join(f"{k}={v}" for k, v in p.items()) + ")"
