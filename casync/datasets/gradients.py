"""The gradients every system in a comparison synchronizes: one deterministic flat vector per worker.

Worker ``w``'s gradient is ``standard_normal(numel)`` from ``numpy.random.default_rng([seed, w])`` laid out
in backward order, so any process (a Ray task on the worker's node, a gloo rank, the driver checking
results) can make exactly the same tensors without shipping them.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..plan.models import model_tensors
from ..plan.syncplan import SyncPlan


def model_shapes(model: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) in backward order, the order of the flat vector."""
    return [(name, tuple(shape)) for name, shape in model_tensors(model)]


def model_numel(model: str) -> int:
    return sum(math.prod(shape) for _, shape in model_shapes(model))


def worker_flat(model: str, worker: int, seed: int = 0) -> np.ndarray:
    """Worker ``worker``'s whole gradient as one float32 vector (backward order)."""
    rng = np.random.default_rng([seed, worker])
    return rng.standard_normal(model_numel(model), dtype=np.float32)


def bucket_layout(plan: SyncPlan) -> tuple[tuple[str, int], ...]:
    """What the bucket buffers of a plan look like: (name, numel) per bucket, in order."""
    return tuple((b.name, b.numel) for b in plan.buckets)


def exact_mean(model: str, workers: int, seed: int = 0) -> np.ndarray:
    """The exact mean over workers (float64 accumulation), what codec ``none`` must reproduce."""
    acc = np.zeros(model_numel(model), dtype=np.float64)
    for w in range(workers):
        acc += worker_flat(model, w, seed)
    acc /= workers
    return acc.astype(np.float32)


def make_bucket_buffers(model: str, worker: int, seed: int, layout: tuple[tuple[str, int], ...]) -> dict[str, Any]:
    """Worker ``worker``'s gradient cut into buckets of ``layout`` (runs as a Ray task on the worker's node)."""
    flat = worker_flat(model, worker, seed)
    out, offset = {}, 0
    for name, numel in layout:
        out[name] = flat[offset:offset + numel]
        offset += numel
    if offset != flat.size:
        raise ValueError(f"bucket layout covers {offset} elements, model {model!r} has {flat.size}")
    return out
