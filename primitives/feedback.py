"""Whether a bucket's encodes keep error-feedback residuals, and which kind: the one rule, for every layer.

``error_feedback`` is ``"auto"`` (the default), ``True`` or ``False`` wherever a plan is built:

* a lossless codec never needs it;
* a contractive codec (``Codec.ef_sound``: onebit, topk, randomk, fp16, tbq) gets plain error feedback
  with ``"auto"`` or ``True``;
* an unbiased stochastic codec (terngrad, qsgd) is not contractive, and plain error feedback diverges with
  it; with ``"auto"`` or ``True`` it gets error feedback on its contractive version
  (``Codec.encode_contractive``: the output scaled by ``1 / (1 + omega)``), which converges;
* a codec that declares neither (the conservative default of a codec you register) runs without error
  feedback under ``"auto"``, and ``True`` is refused with a ValueError naming it: never a silent no-op.

:func:`casync.primitives.ops.run_encode` applies the contractive version wherever a node with error feedback
encodes with a codec that is not ``ef_sound``, so every engine does exactly the same.
"""
from __future__ import annotations

from typing import Any, Union

from .codecs import Codec

ErrorFeedback = Union[bool, str]
MODES: tuple[Any, ...] = ("auto", True, False)


def check(value: Any) -> ErrorFeedback:
    """``value`` if it is ``"auto"``, ``True`` or ``False``; TypeError naming the option otherwise."""
    if value is True or value is False or (isinstance(value, str) and value == "auto"):
        return value
    raise TypeError(f"error_feedback must be 'auto', True or False, got {value!r}")


def resolve(codec: Codec, requested: ErrorFeedback) -> bool:
    """Whether encodes with ``codec`` keep residuals when the plan asks for ``requested``."""
    check(requested)
    if requested is False or codec.lossless:
        return False
    if codec.ef_sound or codec.has_contractive:
        return True
    if requested == "auto":
        return False
    raise ValueError(f"error_feedback=True with codec {str(codec)!r}: plain error feedback is not known to be "
                     "sound for it (it does not set ef_sound = True) and it has no contractive version "
                     "(encode_contractive); use error_feedback='auto' (off for this codec) or False, or declare "
                     "ef_sound = True if the codec is contractive")


def kind(codec: Codec, on: bool) -> str:
    """How a bucket's residuals work, for summaries: ``"off"``, ``"plain"`` or ``"contractive"``."""
    if not on:
        return "off"
    return "plain" if codec.ef_sound else "contractive"
