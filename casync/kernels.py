"""What each primitive does to data: the one implementation every engine calls.

LocalEngine and the Ray actors both run :func:`run_node`, which is why their results are bit-identical.
Nothing here knows about graphs or Ray: a node's attributes, its inputs and the actor's state come in,
the node's output goes out.
"""
from __future__ import annotations

from typing import Any, Mapping, MutableMapping, Sequence

import numpy as np

from primitives.codecs import Codec, Payload


def encode_seed(plan_seed: int, step: int, seed_key: int) -> int:
    """A 64-bit seed unique to (plan seed, iteration, node), the same in every process."""
    words = np.random.SeedSequence([plan_seed, step, seed_key]).generate_state(2, np.uint32)
    return int(words[0]) | (int(words[1]) << 32)


def run_encode(codec: Codec, x: np.ndarray, seed: int, residuals: MutableMapping[str, np.ndarray] | None,
               ef_key: str | None) -> Payload:
    """Encode ``x``; with error feedback, add the stored residual first and keep the new one."""
    if ef_key is None or residuals is None:
        return codec.encode(x, seed)
    residual = residuals.get(ef_key)
    corrected = x + residual if residual is not None else x.copy()
    payload = codec.encode(corrected, seed)
    np.subtract(corrected, codec.decode(payload, corrected.size), out=corrected)
    residuals[ef_key] = corrected
    return payload


def run_merge(inputs: Sequence[np.ndarray], divisor: int) -> np.ndarray:
    """Sum ``inputs`` left to right in float32 (a fixed order, so results are reproducible), then divide."""
    if len(inputs) == 1:
        acc = np.array(inputs[0], dtype=np.float32, copy=True)
    else:  # the first add allocates the accumulator: one pass fewer than copy-then-add, the same float32 sums
        acc = np.add(inputs[0], inputs[1], dtype=np.float32)
        for x in inputs[2:]:
            np.add(acc, x, out=acc)
    if divisor != 1:
        np.divide(acc, np.float32(divisor), out=acc)
    return acc


def run_node(attrs: Mapping[str, Any], inputs: Sequence[Any], local: np.ndarray | None, *,
             codecs: Mapping[str, Codec], residuals: MutableMapping[str, np.ndarray] | None,
             plan_seed: int, step: int) -> Any:
    """Execute one primitive.

    ``inputs`` are the outputs of the node's predecessors ordered by edge ``slot``; ``local`` is the
    actor's own gradient partition, used by nodes with ``local_input``.  send/recv pass payloads through:
    moving them is the engine's job.
    """
    op = attrs["op"]
    if op == "encode":
        x = local if attrs["local_input"] else inputs[0]
        seed = encode_seed(plan_seed, step, attrs["seed_key"])
        return run_encode(codecs[attrs["codec"]], x, seed, residuals, attrs["ef_key"] if attrs["ef"] else None)
    if op == "decode":  # no consumer mutates a decoded value; results are copied into fresh buffers
        return codecs[attrs["codec"]].decode_shared(inputs[0], attrs["numel"])
    if op == "merge":
        values = list(inputs)
        if attrs["local_input"]:
            values.insert(attrs["local_slot"], local)
        return run_merge(values, attrs["divisor"])
    if op in ("send", "recv"):
        return inputs[0]
    raise ValueError(f"unknown primitive {op!r}")
