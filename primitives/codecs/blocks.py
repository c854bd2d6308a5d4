"""``BlockDecoder``: the base of the codecs whose payload decodes any block on its own (sign bits, 2-bit codes)."""
from __future__ import annotations

from abc import abstractmethod

import numpy as np

from .base import Codec, Payload


class BlockDecoder(Codec):
    """A codec whose payload decodes any block on its own (``decodes_in_blocks``): it implements :meth:`_decode`, and
    :meth:`decode`, :meth:`decode_into` and :meth:`decode_block` are that one method (sign bits, 2-bit codes)."""

    decodes_in_blocks = True

    @abstractmethod
    def _decode(self, payload: Payload, n: int, start: int, stop: int | None, out: np.ndarray | None) -> np.ndarray:
        """Elements ``start:stop`` (None: to the end) of the decoded tensor, into ``out`` or a fresh array."""

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        return self._decode(payload, n, 0, None, None)

    def decode_into(self, payload: Payload, n: int, out: np.ndarray) -> np.ndarray:
        return self._decode(payload, n, 0, None, out)

    def decode_block(self, payload: Payload, n: int, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        return self._decode(payload, n, start, stop, out)
