"""What each primitive does to data: the one implementation every engine calls.

LocalEngine and the Ray actors both run :func:`run_node`, which is why their results are bit-identical.
Nothing here knows about graphs or Ray: a node's attributes, its inputs and the actor's state come in,
the node's output goes out.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping, MutableMapping, MutableSet, Sequence

import numpy as np

from casync.primitives.codecs import Codec, Payload

from .codecs.residual import buffer_of, materialized
from .finite import attach, carries_nonfinite, restore, split_nonfinite
from .merge import Deferred, PendingMerge, Sparse, merges_in_encode, run_merge
from .residuals import Residuals, stored

__all__ = ["Deferred", "PendingMerge", "Sparse", "encode_seed", "run_encode", "run_merge", "run_node"]


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


def run_encode(codec: Codec, x: np.ndarray | PendingMerge, seed: int, residuals: MutableMapping[str, np.ndarray] | None,
               ef_key: str | None, check: bool = False,
               spares: MutableMapping[str, np.ndarray] | None = None) -> Payload:
    """Encode ``x``; with error feedback, add the stored residual first and keep the new one.

    Error feedback encodes with the codec's contractive version (``Codec.encode_contractive``) when plain
    error feedback is not sound for it (``Codec.ef_sound`` is False: unbiased stochastic codecs), so residuals
    stay bounded (see :mod:`casync.primitives.feedback`).

    ``check``: ``x`` may hold NaN/Inf (see :mod:`casync.nonfinite`): those entries are encoded as zero and
    ride along in the payload exactly; the residual is zero there.

    ``spares``: residual arrays the caller no longer needs, by key (the residuals of two steps back): the new
    residual is written into its key's spare where it fits, so a step allocates no residual memory.

    ``residuals`` may be a :class:`~casync.primitives.residuals.Residuals` store: a codec that ``defers_residual``
    then keeps its new residual deferred there (the same floats, one pass fewer; see
    :mod:`casync.primitives.codecs.residual`).  A plain dict only ever holds arrays.

    ``x`` may be a merge still to run (:class:`PendingMerge`): a codec that ``merges_in_encode`` computes it
    block by block as it adds the residual; otherwise it is run first.
    """
    ef = ef_key is not None and residuals is not None
    residual = stored(residuals, ef_key) if ef else None
    pending = isinstance(x, PendingMerge)
    if residual is not None and not check and codec.ef_sound and (not pending or merges_in_encode(codec)):
        # the common case, fused where the codec can (a pending merge is computed as the residual is added);
        # in a Residuals store the new residual may stay deferred (its last pass left to the next step's encode)
        defer = codec.defers_residual and isinstance(residuals, Residuals)
        encode = codec.encode_feedback_deferred if defer else codec.encode_feedback
        residual = residual if defer else materialized(residual)
        spare = spares.pop(ef_key, None) if spares else None
        reads = x.arrays() if pending else [x]
        if (spare is not None and spare.shape == x.shape and spare.dtype == np.float32 and spare.flags.writeable
                and spare.flags.c_contiguous and (defer or _takes_out(codec))
                and not np.may_share_memory(spare, buffer_of(residual))
                and not any(np.may_share_memory(spare, a) for a in reads)):
            payload, residuals[ef_key] = encode(x, residual, seed, out=spare)
        else:
            payload, residuals[ef_key] = encode(x, residual, seed)
        return payload
    residual = materialized(residual)
    if pending:
        x = x.run()
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
    :class:`Deferred` that the merge expands block by block, and where it decodes to a few entries, a
    :class:`Sparse` that the merge adds at their indices.  For a merge, that its only reader is an
    error-feedback encode: it becomes a :class:`PendingMerge` that the encode computes (see :func:`run_encode`).
    ``spares``: recycled residual buffers for the encodes (see :func:`run_encode`).
    """
    op = attrs["op"]
    if op == "encode":
        x = local if attrs["local_input"] else inputs[0]
        codec = codecs[attrs["codec"]]
        seed = 0 if codec.ignores_seed else encode_seed(plan_seed, step, attrs["seed_key"])
        check = flagged is not None and (attrs["bucket"], attrs["part"]) in flagged
        return run_encode(codec, x, seed, residuals, attrs["ef_key"] if attrs["ef"] else None, check, spares)
    if op == "decode":  # no consumer mutates a decoded value
        payload = inputs[0]
        if carries_nonfinite(payload):
            if flagged is not None:
                flagged.add((attrs["bucket"], attrs["part"]))
            return restore(codecs[attrs["codec"]].decode(payload, attrs["numel"]), payload)
        codec = codecs[attrs["codec"]]
        if defer and codec.decodes_in_blocks:
            return Deferred(codec, payload, attrs["numel"])
        if defer and codec.decodes_sparse:
            entries = codec.sparse_entries(payload, attrs["numel"])
            if entries is not None:
                return Sparse(*entries, attrs["numel"])
        if out is not None:
            return codec.decode_into(payload, attrs["numel"], out)
        return codec.decode_shared(payload, attrs["numel"])
    if op == "merge":
        values = list(inputs)
        if attrs["local_input"]:
            values.insert(attrs["local_slot"], local)
        if defer:
            return PendingMerge(values, attrs["divisor"], attrs["numel"])
        return run_merge(values, attrs["divisor"], out)
    if op in ("send", "recv"):
        return inputs[0]
    raise ValueError(f"unknown primitive {op!r}")
