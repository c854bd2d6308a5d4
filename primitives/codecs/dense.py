"""Dense codecs: ``none`` (identity, lossless) and ``fp16`` (IEEE half precision)."""
from __future__ import annotations

import functools
import math
import sys
import warnings

import numpy as np

from .base import (BLOCK, Codec, Payload, add_block, as_input, block_sum, check_length, feedback_input, field,
                   merges_pending, scratch)


class NoneCodec(Codec):
    """Identity: the payload is the input itself (the engine copies outputs)."""

    name = "none"
    lossless = True
    ef_sound = True
    ignores_seed = True

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
    as in PyTorch's ``fp16_compress_hook`` (so a GradScaler sees the overflow and skips the step).  With error
    feedback the residual of a value that went as ±inf or NaN is 0 (not ∓inf or NaN): one overflow must not
    poison every later step."""

    name = "fp16"
    ef_sound = True
    decodes_in_blocks = True
    ignores_seed = True

    def encode(self, x: np.ndarray, seed: int = 0) -> Payload:
        x = as_input(x)
        return {"values": cast(x, np.empty(x.size, np.float16))}

    def decode(self, payload: Payload, n: int) -> np.ndarray:
        n = check_length(n)
        return cast(field(payload, "values", np.float16, (n,), self.name), np.empty(n, np.float32))

    def encode_keep_error(self, x: np.ndarray, seed: int = 0) -> Payload:
        """The default's floats, with the decoded values subtracted block by block from a cache-sized scratch
        buffer instead of a decoded tensor."""
        as_input(x)  # validates; the remainder is written into x itself, strided or not
        return self._sweep(x, None, x)

    @merges_pending
    def encode_feedback(self, x: np.ndarray, residual: np.ndarray, seed: int = 0,
                        out: np.ndarray | None = None) -> tuple[Payload, np.ndarray]:
        """The default's floats in one sweep: each block of ``x + residual`` is cast, cast back and subtracted
        while it is in cache."""
        x = feedback_input(x)
        if residual.shape != x.shape or residual.dtype != np.float32:
            return super().encode_feedback(x, residual, seed, out)
        corrected = np.empty(x.size, np.float32) if out is None else out
        return self._sweep(x, residual, corrected), corrected

    def _sweep(self, x: np.ndarray, addend: np.ndarray | None, out: np.ndarray) -> Payload:
        """The payload of ``out = x (+ addend)``, leaving in ``out`` what it does not carry, block by block."""
        n = x.size
        values = np.empty(n, np.float16)
        decoded = scratch("fp16-decoded", np.float32, min(n, BLOCK))
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf, then inf - inf, as the default
            for start in range(0, n, BLOCK):
                block = slice(start, start + BLOCK)
                c = out[block]
                if addend is not None:
                    add_block(x, addend, start, start + c.size, c)
                cast(c, values[block])
                np.subtract(c, cast(values[block], decoded[: c.size]), out=c)
                if not math.isfinite(block_sum(c)):  # (the block is in cache: a cheap check)
                    # a finite value beyond ±65504 went as ±inf and left ∓inf here, an Inf (or NaN) that reached
                    # this encode through a merge left NaN: each travelled as itself, nothing to carry
                    c[~np.isfinite(c)] = 0
        return {"values": values}

    def decode_into(self, payload: Payload, n: int, out: np.ndarray) -> np.ndarray:
        return self.decode_block(payload, n, 0, check_length(n), out)

    def decode_block(self, payload: Payload, n: int, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        return cast(field(payload, "values", np.float16, (check_length(n),), self.name)[start:stop], out)  # exact

    def compressed_nbytes(self, n: int) -> int:
        return 2 * check_length(n)


#: Below this many elements NumPy's cast is as quick as handing the arrays to PyTorch.
TORCH_CAST_MIN = 1 << 14


def cast(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[:] = src`` between float32 and float16 (round to nearest even; beyond ±65504 is ±inf), returned.

    NumPy casts to and from float16 one element at a time (about 1.5 ns per element here); PyTorch's CPU
    kernels use the F16C instructions and take a tenth of that.  So where this process has already imported
    torch (the DDP hook, the Trainer, RayEngine's actors of a plan with fp16; this module never imports it),
    the copy goes through ``torch.Tensor.copy_``.  Both give the same bits for every float32 and
    float16 input that is not a NaN (checked exhaustively), and a NaN stays a NaN (its payload bits may
    differ): engines agree whichever path each one takes.
    """
    torch = sys.modules.get("torch")
    if (torch is None or src.size < TORCH_CAST_MIN or not hasattr(torch, "from_numpy")
            or min(src.strides) < 0 or min(out.strides) < 0):  # torch.from_numpy refuses negative strides
        with np.errstate(over="ignore"):
            np.copyto(out, src, casting="same_kind")
        return out
    if not src.flags.writeable:  # a payload from a read-only buffer: torch would warn, though it only reads it
        _quiet_read_only_warning()
    torch.from_numpy(out).copy_(torch.from_numpy(src))
    return out


@functools.cache
def _quiet_read_only_warning() -> None:
    """Silence, once and for that message only, torch's warning about wrapping a read-only array
    (``warnings.catch_warnings`` around every cast would be slow and is not thread-safe)."""
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
