"""The merge primitive: sum a partition's inputs in a fixed order, then divide.

Every engine runs :func:`run_merge`.  Its inputs are decoded arrays, or decodes the per-rank executor left
undone because a merge is their only reader: :class:`Deferred` (a codec that decodes block by block: the
merge expands each cache-sized block as it adds) and :class:`Sparse` (a sparsifier's entries: the merge adds
them at their indices instead of adding a tensor of zeros).  Either way the result is bit for bit the merge
of the decoded arrays, signed zeros included.

The merge itself may be left undone too: where its only reader is an error-feedback encode, the executor
hands that encode a :class:`PendingMerge`, which the codec computes block by block as it adds the residual
(:meth:`PendingMerge.into`), so the merged tensor is never written to memory and read back.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from casync.primitives.codecs import Codec, Payload
from casync.primitives.codecs.base import BLOCK, clear, scratch

_NEGATIVE_ZERO = np.uint32(0x80000000)


class Deferred(NamedTuple):
    """A decode whose only reader is a merge, of a codec with ``decodes_in_blocks``: the merge decodes it
    block by block as it adds, so no tensor-sized decoded array is written and read back."""

    codec: Codec
    payload: Payload
    n: int


class Sparse(NamedTuple):
    """A decode whose only reader is a merge, of a codec with ``decodes_sparse``: ``values`` at ``indices``
    (strictly ascending) and +0.0 everywhere else of ``n``."""

    indices: np.ndarray
    values: np.ndarray
    n: int


Input = np.ndarray | Deferred | Sparse


def handed_to_merge(attrs: Mapping[str, Any], readers: Sequence[str]) -> bool:
    """Whether a node is a decode the per-rank executor leaves to its merge (:class:`Deferred` or
    :class:`Sparse`, where the codec can): not an output, and read by one merge only.  ``readers``: the ops
    of the node's consumers.  The simulator prices such decodes by the same rule."""
    return attrs["op"] == "decode" and not attrs.get("output") and len(readers) == 1 and readers[0] == "merge"


def handed_to_encode(attrs: Mapping[str, Any], readers: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a node is a merge the per-rank executor leaves to its reader (a :class:`PendingMerge`): not an
    output, and read by one error-feedback encode only.  ``readers``: the attributes of the node's consumers.
    Whether the encode's codec then computes it block by block is :func:`merges_in_encode`; the simulator
    prices such merges by the same two rules."""
    return (attrs["op"] == "merge" and not attrs.get("output") and len(readers) == 1
            and readers[0]["op"] == "encode" and bool(readers[0].get("ef")))


def merges_in_encode(codec: Codec | type) -> bool:
    """Whether ``codec``'s error-feedback encode takes a :class:`PendingMerge` as its input: it runs
    ``encode_feedback`` (``ef_sound``; a contractive one runs another path) and that method is marked
    :func:`casync.primitives.codecs.base.merges_pending`, so an override that does not handle one is never handed
    one."""
    cls = codec if isinstance(codec, type) else type(codec)
    return bool(cls.ef_sound and getattr(cls.encode_feedback, "merges_pending", False))


class PendingMerge:
    """A merge not yet run, handed to the error-feedback encode that is its only reader: :meth:`into` computes
    any block of it (bit for bit that block of :func:`run_merge`, which works element by element, except which
    NaN a sum of two NaNs is in a block of one element: NumPy's one-element loop returns the other operand's),
    and :meth:`run` the whole."""

    __slots__ = ("inputs", "divisor", "n")

    def __init__(self, inputs: Sequence[Input], divisor: int, n: int):
        self.inputs, self.divisor, self.n = tuple(inputs), divisor, n

    @property
    def size(self) -> int:
        return self.n

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def arrays(self) -> list[np.ndarray]:
        """The dense arrays it reads (to check that an output buffer does not overlap them)."""
        return [x for x in self.inputs if isinstance(x, np.ndarray)]

    def run(self, out: np.ndarray | None = None) -> np.ndarray:
        return run_merge(self.inputs, self.divisor, out)

    def into(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Elements ``start:stop`` of the merge, written into ``out`` (float32, ``stop - start`` long)."""
        blocks: list[Input] = []
        for i, x in enumerate(self.inputs):
            if isinstance(x, np.ndarray):
                blocks.append(x[start:stop])
            elif isinstance(x, Sparse):
                lo, hi = np.searchsorted(x.indices, (start, stop))
                blocks.append(Sparse(x.indices[lo:hi] - start, x.values[lo:hi], stop - start))
            else:
                buf = scratch(f"pending{i}", np.float32, stop - start)
                blocks.append(x.codec.decode_block(x.payload, x.n, start, stop, buf[: stop - start]))
        return run_merge(blocks, self.divisor, out)


def run_merge(inputs: Sequence[Input], divisor: int, out: np.ndarray | None = None) -> np.ndarray:
    """Sum ``inputs`` left to right in float32 (a fixed order, so results are reproducible), then divide;
    into ``out`` or a fresh array."""
    if any(isinstance(x, Sparse) for x in inputs):
        return _merge_sparse(inputs, divisor, out)
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


def _length(x: Input) -> int:
    return x.size if isinstance(x, np.ndarray) else x.n


def _merge_blocks(inputs: Sequence[np.ndarray | Deferred], divisor: int, out: np.ndarray | None) -> np.ndarray:
    """:func:`run_merge` block by block (:meth:`PendingMerge.into`), decoding :class:`Deferred` inputs one
    cache-sized block at a time, or through the codec's one-pass merge (``Codec.fused_merge``) where it has one:
    the same additions in the same order, so the same floats."""
    n = _length(inputs[0])
    acc = np.empty(n, np.float32) if out is None else out
    pending = PendingMerge(inputs, divisor, n)
    codec = next(x.codec for x in inputs if isinstance(x, Deferred))
    fused = codec.fused_merge(inputs, divisor)  # the codec's one-pass merge of these inputs, if it has one
    for start in range(0, n, BLOCK):
        stop = min(n, start + BLOCK)
        cut = start if fused is None else fused.block(start, stop, acc)
        if cut < stop:
            pending.into(cut, stop, acc[cut:stop])
    return acc


def _merge_sparse(inputs: Sequence[Input], divisor: int, out: np.ndarray | None) -> np.ndarray:
    """:func:`run_merge` adding :class:`Sparse` inputs at their indices only: the same additions of the
    same nonzero terms in the same order.

    Adding a decoded tensor's +0.0 changes nothing but a -0.0 (into +0.0), so the accumulator's -0.0
    positions are tracked (``neg``, a superset of them, as a few indices): where a sparse input does not
    touch one, it becomes +0.0 as the dense add would have made it.
    """
    n = _length(inputs[0])
    acc = np.empty(n, np.float32) if out is None else out
    neg: np.ndarray | None = None  # None: not tracked yet (found by a scan when first needed)
    first, rest = inputs[0], list(inputs[1:])
    with np.errstate(invalid="ignore"):
        if isinstance(first, Sparse):
            clear(acc)
            acc[first.indices] = first.values  # exactly the decoded tensor
            neg = first.indices[_negative_zeros(first.values)]
        elif isinstance(first, np.ndarray) and isinstance(rest[0], Sparse) and not np.may_share_memory(first, acc):
            # a dense tensor plus a sparse one, in the pass that copies it: + 0.0 where the entries are not
            # (a -0.0 there becomes +0.0, as adding the decoded zeros makes it), + the value where they are;
            # so no scan for -0.0 is needed: only an entry's sum can be one
            x = rest.pop(0)
            np.add(first, np.float32(0), out=acc)
            acc[x.indices] = first[x.indices] + x.values
            neg = x.indices[_negative_zeros(acc[x.indices])]
        else:
            _decode_into(first, acc)
        for x in rest:
            if isinstance(x, Sparse):
                if neg is None:
                    neg = np.flatnonzero(_negative_zeros(acc))
                if neg.size:
                    touched = _members(neg, x.indices)
                    acc[neg[~touched]] = 0  # -0.0 + (+0.0)
                    neg = neg[touched]
                np.add.at(acc, x.indices, x.values)  # distinct indices: acc[i] + v once each
            else:
                np.add(acc, x if isinstance(x, np.ndarray) else x.codec.decode(x.payload, x.n), out=acc)
            if neg is not None and neg.size:  # a sum is -0.0 only where both terms were
                neg = neg[_negative_zeros(acc[neg])]
        if divisor != 1:  # one pass: cheaper than finding the union of the indices
            np.divide(acc, np.float32(divisor), out=acc)
    return acc


def _decode_into(x: np.ndarray | Deferred, out: np.ndarray) -> None:
    if isinstance(x, Deferred):
        x.codec.decode_into(x.payload, x.n, out)
    else:
        np.copyto(out, x)


def _negative_zeros(values: np.ndarray) -> np.ndarray:
    """Where ``values`` (float32) hold -0.0, by bits."""
    return values.view(np.uint32) == _NEGATIVE_ZERO


def _members(a: np.ndarray, sorted_b: np.ndarray) -> np.ndarray:
    """Whether each element of ``a`` is in ``sorted_b`` (ascending)."""
    if sorted_b.size == 0:
        return np.zeros(a.size, np.bool_)
    pos = np.searchsorted(sorted_b, a)
    pos[pos == sorted_b.size] = 0
    return sorted_b[pos] == a
