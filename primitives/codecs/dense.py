"""Dense codecs: ``none`` (identity, lossless) and ``fp16`` (IEEE half precision)."""
from __future__ import annotations

import numpy as np

from .base import Codec, Payload, as_input, check_length, field


class NoneCodec(Codec):
    """Identity: the payload is the input itself (the engine copies outputs)."""

    name = "none"
    lossless = True
    ef_sound = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        return {"values": as_input(x)}

    def encode_keep_error(self, x: np.ndarray, seed: int = 0) -> Payload:
        """The payload must not alias ``x``, which becomes the (zero) remainder."""
        values = as_input(x).copy()
        np.subtract(x, values, out=x)
        return {"values": values}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        n = check_length(n)
        return field(payload, "values", np.float32, (n,), self.name).copy()

    def decode_shared(self, payload: Payload, n: int) -> np.ndarray:
        """The payload's own array, validated: identity needs no copy when nobody mutates it."""
        return field(payload, "values", np.float32, (n,), self.name)

    def compressed_nbytes(self, n: int) -> int:
        return 4 * check_length(n)


class FP16Codec(Codec):
    """Cast to float16 (round to nearest even); values beyond ±65504 become ±inf,
    as in PyTorch's ``fp16_compress_hook``."""

    name = "fp16"
    ef_sound = True
    decodes_in_blocks = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        with np.errstate(over="ignore"):
            return {"values": x.astype(np.float16)}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        n = check_length(n)
        return field(payload, "values", np.float16, (n,), self.name).astype(np.float32)

    def decode_into(self, payload: Payload, n: int, out: np.ndarray) -> np.ndarray:
        return self.decode_block(payload, n, 0, check_length(n), out)

    def decode_block(self, payload: Payload, n: int, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        np.copyto(out, field(payload, "values", np.float16, (check_length(n),), self.name)[start:stop])  # exact
        return out

    def compressed_nbytes(self, n: int) -> int:
        return 2 * check_length(n)
