"""What each primitive does to data: the one implementation every engine calls.

LocalEngine and the Ray actors both run :func:`run_node`, which is why their results are bit-identical.
Nothing here knows about graphs or Ray: a node's attributes, its inputs and the actor's state come in,
the node's output goes out.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping, MutableMapping, MutableSet, NamedTuple, Sequence

import numpy as np

from primitives.codecs import Codec, Payload
from primitives.codecs.base import BLOCK, scratch

from .finite import attach, carries_nonfinite, restore, split_nonfinite


def encode_seed(plan_seed: int, step: int, seed_key: int) -> int:
    """A 64-bit seed unique to (plan seed, iteration, node), the same in every process."""
    words = np.random.SeedSequence([plan_seed, step, seed_key]).generate_state(2, np.uint32)
    return int(words[0]) | (int(words[1]) << 32)


def _takes_out(codec: Codec) -> bool:
    """Whether ``codec.encode_feedback`` accepts ``out=`` (a codec registered before it existed may not)."""
    kind = type(codec)
    known = _TAKES_OUT.get(kind)
    if known is None:
        known = _TAKES_OUT[kind] = "out" in inspect.signature(codec.encode_feedback).parameters
    return known


_TAKES_OUT: dict[type, bool] = {}


def run_encode(codec: Codec, x: np.ndarray, seed: int, residuals: MutableMapping[str, np.ndarray] | None,
               ef_key: str | None, check: bool = False,
               spares: MutableMapping[str, np.ndarray] | None = None) -> Payload:
    """Encode ``x``; with error feedback, add the stored residual first and keep the new one.

    Error feedback encodes with the codec's contractive version (``Codec.encode_contractive``) when plain
    error feedback is not sound for it (``Codec.ef_sound`` is False: unbiased stochastic codecs), so residuals
    stay bounded (see :mod:`primitives.feedback`).

    ``check``: ``x`` may hold NaN/Inf (see :mod:`casync.nonfinite`): those entries are encoded as zero and
    ride along in the payload exactly; the residual is zero there.

    ``spares``: residual arrays the caller no longer needs, by key (the residuals of two steps back): the new
    residual is written into its key's spare where it fits, so a step allocates no residual memory.
    """
    ef = ef_key is not None and residuals is not None
    residual = residuals.get(ef_key) if ef else None
    if residual is not None and not check and codec.ef_sound:  # the common case, fused where the codec can
        spare = spares.pop(ef_key, None) if spares else None
        if (spare is not None and spare.shape == x.shape and spare.dtype == np.float32 and spare.flags.writeable
                and spare.flags.c_contiguous and _takes_out(codec) and not np.may_share_memory(spare, x)
                and not np.may_share_memory(spare, residual)):
            payload, residuals[ef_key] = codec.encode_feedback(x, residual, seed, out=spare)
        else:
            payload, residuals[ef_key] = codec.encode_feedback(x, residual, seed)
        return payload
    corrected = x + residual if residual is not None else x
    side = split_nonfinite(corrected) if check else None
    if side is not None:
        corrected = side[0]  # a fresh copy with the NaN/Inf zeroed
    if not ef:
        payload = codec.encode(corrected, seed)
    else:
        if corrected is x:
            corrected = x.copy()
        keep = codec.encode_keep_error if codec.ef_sound else codec.encode_keep_error_contractive
        payload = keep(corrected, seed)  # corrected becomes the unsent remainder
        if side is not None:
            corrected[side[1]] = 0
        residuals[ef_key] = corrected
    return payload if side is None else attach(payload, side[1], side[2])


class Deferred(NamedTuple):
    """A decode whose only reader is a merge (``run_node(..., defer=True)``): the merge decodes it block by
    block as it adds, so no tensor-sized decoded array is written and read back."""

    codec: Codec
    payload: Payload
    n: int


def run_merge(inputs: Sequence[np.ndarray | Deferred], divisor: int, out: np.ndarray | None = None) -> np.ndarray:
    """Sum ``inputs`` left to right in float32 (a fixed order, so results are reproducible), then divide;
    into ``out`` or a fresh array."""
    if any(isinstance(x, Deferred) for x in inputs):
        return _merge_blocks(inputs, divisor, out)
    with np.errstate(invalid="ignore"):  # Inf + -Inf = NaN is what nonfinite="propagate" asks for
        if len(inputs) == 1:
            acc = np.array(inputs[0], dtype=np.float32, copy=True) if out is None else out
            if out is not None:
                np.copyto(out, inputs[0])
        else:  # the first add allocates the accumulator: one pass fewer than copy-then-add, same float32 sums
            acc = np.add(inputs[0], inputs[1], dtype=np.float32, out=out)
            for x in inputs[2:]:
                np.add(acc, x, out=acc)
        if divisor != 1:
            np.divide(acc, np.float32(divisor), out=acc)
    return acc


def _merge_blocks(inputs: Sequence[np.ndarray | Deferred], divisor: int, out: np.ndarray | None) -> np.ndarray:
    """:func:`run_merge` block by block, decoding :class:`Deferred` inputs one cache-sized block at a time:
    the same additions in the same order, so the same floats."""
    n = next(x.n if isinstance(x, Deferred) else x.size for x in inputs)
    acc = np.empty(n, np.float32) if out is None else out
    bufs = [scratch(f"merge{i}", np.float32, min(n, BLOCK)) if isinstance(x, Deferred) else None
            for i, x in enumerate(inputs)]
    with np.errstate(invalid="ignore"):
        for start in range(0, n, BLOCK):
            stop = min(n, start + BLOCK)
            blocks = [x.codec.decode_block(x.payload, x.n, start, stop, bufs[i][: stop - start])
                      if isinstance(x, Deferred) else x[start:stop] for i, x in enumerate(inputs)]
            a = acc[start:stop]
            if len(blocks) == 1:
                np.copyto(a, blocks[0])
            else:
                np.add(blocks[0], blocks[1], out=a, dtype=np.float32)
                for b in blocks[2:]:
                    np.add(a, b, out=a)
            if divisor != 1:
                np.divide(a, np.float32(divisor), out=a)
    return acc


def run_node(attrs: Mapping[str, Any], inputs: Sequence[Any], local: np.ndarray | None, *,
             codecs: Mapping[str, Codec], residuals: MutableMapping[str, np.ndarray] | None,
             plan_seed: int, step: int, flagged: MutableSet[tuple[str, int]] | None = None,
             out: np.ndarray | None = None, defer: bool = False,
             spares: MutableMapping[str, np.ndarray] | None = None) -> Any:
    """Execute one primitive.

    ``inputs`` are the outputs of the node's predecessors ordered by edge ``slot``; ``local`` is the
    actor's own gradient partition, used by nodes with ``local_input``.  send/recv pass payloads through:
    moving them is the engine's job.  ``flagged``: this actor's (bucket, partition) pairs that may hold
    NaN/Inf in this step (its gradient scan, plus every payload it decoded that carried some); encodes of
    those check their input, every other encode runs as if the data were finite.  ``out``: where a decode
    or merge may write its output (the node's slice of the result buffer); the output returned is then
    ``out`` itself, or a fresh array where the node could not write there.  ``defer``: the caller knows a
    decode's only reader is a merge; where the codec decodes in blocks, the decode becomes a
    :class:`Deferred` that the merge expands block by block.  ``spares``: recycled residual buffers for the
    encodes (see :func:`run_encode`).
    """
    op = attrs["op"]
    if op == "encode":
        x = local if attrs["local_input"] else inputs[0]
        seed = encode_seed(plan_seed, step, attrs["seed_key"])
        check = flagged is not None and (attrs["bucket"], attrs["part"]) in flagged
        return run_encode(codecs[attrs["codec"]], x, seed, residuals, attrs["ef_key"] if attrs["ef"] else None,
                          check, spares)
    if op == "decode":  # no consumer mutates a decoded value
        payload = inputs[0]
        if carries_nonfinite(payload):
            if flagged is not None:
                flagged.add((attrs["bucket"], attrs["part"]))
            return restore(codecs[attrs["codec"]].decode(payload, attrs["numel"]), payload)
        codec = codecs[attrs["codec"]]
        if defer and codec.decodes_in_blocks:
            return Deferred(codec, payload, attrs["numel"])
        if out is not None:
            return codec.decode_into(payload, attrs["numel"], out)
        return codec.decode_shared(payload, attrs["numel"])
    if op == "merge":
        values = list(inputs)
        if attrs["local_input"]:
            values.insert(attrs["local_slot"], local)
        return run_merge(values, attrs["divisor"], out)
    if op in ("send", "recv"):
        return inputs[0]
    raise ValueError(f"unknown primitive {op!r}")
