"""Payloads as bytes on a wire: one contiguous buffer per payload, laid out ahead of time.

A codec's payload for ``n`` elements always has the same arrays (names, dtypes, shapes) and exactly
``compressed_nbytes(n)`` bytes, so both ends of a transfer know its layout before any byte moves: the
receiver allocates and posts its buffer ahead, and unpacking is zero-copy (views into the buffer).
NaN/Inf riding on the side channel (``casync.primitives.finite``) travel as a second buffer, announced by a
small header.  NumPy only.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .codecs import Codec, Payload
from .finite import NF_INDEX, NF_VALUE, carries_nonfinite

#: A transfer's header: transfer id, step, number of NaN/Inf entries on the side channel, spare.
HEADER_WORDS = 4
SIDE_ITEM_BYTES = 12  # an int64 position and a float32 value


@dataclass(frozen=True)
class Layout:
    """Where each array of a payload sits in its wire buffer (largest item size first: natural alignment)."""

    fields: tuple[tuple[str, str, tuple[int, ...], int], ...]  # (key, dtype, shape, offset)
    nbytes: int

    def __post_init__(self) -> None:
        # (key, dtype, shape, offset, count) with the dtype made and the count computed once: packing and unpacking
        # run for every payload a rank sends and receives
        spans = tuple((key, np.dtype(dtype), shape, offset, int(np.prod(shape, dtype=np.int64)))
                      for key, dtype, shape, offset in self.fields)
        object.__setattr__(self, "_spans", spans)

    def pack(self, payload: Payload, out: np.ndarray | None = None) -> np.ndarray:
        """The payload's bytes as one uint8 buffer: the array itself when there is only one (no copy)."""
        self.check(payload)
        spans = self._spans
        if len(spans) == 1 and out is None:
            return np.ascontiguousarray(payload[spans[0][0]]).reshape(-1).view(np.uint8)
        buf = np.empty(self.nbytes, np.uint8) if out is None else out
        for key, dtype, _, offset, count in spans:
            buf[offset:offset + count * dtype.itemsize] = np.ascontiguousarray(payload[key]).reshape(-1).view(np.uint8)
        return buf

    def unpack(self, buf: np.ndarray) -> Payload:
        """Views of the payload's arrays in ``buf`` (no copy)."""
        if buf.dtype != np.uint8 or buf.shape != (self.nbytes,):
            raise ValueError(f"a wire buffer of {self.nbytes} bytes was expected, got {buf.dtype} {buf.shape}")
        return {key: np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
                for key, dtype, shape, offset, count in self._spans}

    def check(self, payload: Payload) -> None:
        """A payload (NaN/Inf side channel aside) that does not fit the layout is a codec bug: name what differs."""
        spans = self._spans
        extra = len(payload) - len(spans) - (NF_INDEX in payload) - (NF_VALUE in payload)
        for key, dtype, shape, _, _ in spans:
            array = payload.get(key)
            if extra or array is None or array.dtype != dtype or array.shape != shape:
                got = {k: (v.dtype.str, v.shape) for k, v in payload.items() if k not in (NF_INDEX, NF_VALUE)}
                want = {k: (d, s) for k, d, s, _ in self.fields}
                raise ValueError(f"payload arrays {got} do not match the codec's layout {want}: a codec's payload "
                                 "must have the same arrays, dtypes and shapes for every input of one length")


@lru_cache(maxsize=1024)
def layout(codec: Codec, n: int) -> Layout:
    """The wire layout of ``codec``'s payload for ``n`` elements (learnt once from an encode of zeros)."""
    payload = codec.encode(np.zeros(n, np.float32), 0)
    arrays = sorted(payload.items(), key=lambda kv: (-kv[1].dtype.itemsize, kv[0]))
    fields, offset = [], 0
    for key, array in arrays:
        fields.append((key, array.dtype.str, tuple(array.shape), offset))
        offset += array.nbytes
    if offset != codec.compressed_nbytes(n):
        raise ValueError(f"codec {codec}: a payload of {n} elements has {offset} bytes but compressed_nbytes says "
                         f"{codec.compressed_nbytes(n)}")
    return Layout(tuple(fields), offset)


def side_channel(payload: Any) -> np.ndarray | None:
    """The NaN/Inf entries a payload carries as one uint8 buffer (positions, then values), or None."""
    if not carries_nonfinite(payload):
        return None
    index, values = payload[NF_INDEX], payload[NF_VALUE]
    buf = np.empty(index.size * SIDE_ITEM_BYTES, np.uint8)
    buf[:index.nbytes] = index.astype(np.int64, copy=False).view(np.uint8)
    buf[index.nbytes:] = values.astype(np.float32, copy=False).view(np.uint8)
    return buf


def side_count(buf: np.ndarray | None) -> int:
    return 0 if buf is None else buf.size // SIDE_ITEM_BYTES


def attach_side(payload: Payload, buf: np.ndarray) -> Payload:
    """``payload`` with the side channel read from ``buf`` (see :func:`side_channel`)."""
    count = buf.size // SIDE_ITEM_BYTES
    index = np.frombuffer(buf, np.int64, count, 0)
    values = np.frombuffer(buf, np.float32, count, 8 * count)
    return {**payload, NF_INDEX: index, NF_VALUE: values}
