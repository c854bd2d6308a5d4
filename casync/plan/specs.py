"""Plain-data descriptions of what a plan syncs: tensors and the buckets they are fused into."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from casync.primitives.codecs import Codec


@dataclass(frozen=True)
class TensorSpec:
    """One gradient tensor: its name, shape and dtype (always float32 on the wire)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return 4 * self.numel


@dataclass(frozen=True)
class Member:
    """Where a tensor lives inside its bucket's flat buffer."""

    spec: TensorSpec
    offset: int

    @property
    def stop(self) -> int:
        return self.offset + self.spec.numel


@dataclass
class Bucket:
    """A unit of synchronization: one tensor, or several small ones fused (bulk sync).

    The strategy, codec and partitioning are chosen per bucket, so a planner can
    compress the large tensors and leave the small ones alone.
    """

    name: str
    members: list[Member]
    strategy: str
    codec: Codec
    partitions: list[tuple[int, int]]
    priority: int
    two_way: bool = True
    servers: int | None = None
    error_feedback: bool = True
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return self.members[-1].stop if self.members else 0

    @property
    def tensor_names(self) -> list[str]:
        return [m.spec.name for m in self.members]

    @property
    def uses_error_feedback(self) -> bool:
        return self.error_feedback and not self.codec.lossless


def split_even(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(numel)`` into ``parts`` contiguous near-equal slices (never more than numel, at least one)."""
    parts = max(1, min(parts, numel))
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
