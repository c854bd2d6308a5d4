"""``build_plan``: validate options, fuse small tensors into buckets, partition, expand each bucket."""
from __future__ import annotations

from typing import Any

import networkx as nx

from primitives.codecs import Codec, get_codec
from strategies import GraphBuilder, Unit, get_strategy

from .plan import SyncPlan
from .specs import Bucket, Member, TensorSpec, split_even
from .tensors import tensor_specs

DEFAULT_BUCKET_BYTES = 4 << 20  # 4 MiB: large enough to amortise a ~0.7 ms actor call, small enough to pipeline
MAX_PARTITIONS = 1 << 16
MIN_PARTITION_NUMEL = 16384  # default partitioning never cuts below 64 KiB: tiny parts cost latency, save nothing


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def make_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[TensorSpec]]:
    """Fuse consecutive tensors into groups of about ``bucket_bytes``, keeping backward order.

    Small tensors accumulate until the group would exceed ``bucket_bytes``; a tensor at least
    ``bucket_bytes`` large closes the group (the small ones still pending ride along with it, so no tiny
    bucket is left behind).  A bucket is ready when its last member's gradient is.  ``0`` disables fusion.
    """
    groups: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if bucket_bytes == 0:
            groups.append([spec])
            continue
        if spec.nbytes >= bucket_bytes:
            groups.append(current + [spec])
            current, size = [], 0
            continue
        if current and size + spec.nbytes > bucket_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
    if current:
        groups.append(current)
    return groups


def build_plan(
    tensors: Any,
    workers: int = 4,
    strategy: str = "ring",
    codec: str | tuple | Codec | None = "onebit",
    servers: int | None = None,
    partitions: int | None = None,
    two_way: bool = True,
    error_feedback: bool = True,
    op: str = "mean",
    bucket_bytes: int | None = None,
    seed: int = 0,
) -> SyncPlan:
    """Build the sync plan of ``tensors`` across ``workers`` with one strategy and codec for every bucket.

    ``tensors``: dict name->shape, list of (name, shape), a torch.nn.Module or a built-in model name.
    See the README for every option; bad values raise ``TypeError``/``ValueError`` naming the option.
    """
    _check_int("workers", workers, 1)
    module = get_strategy(strategy)
    codec_obj = get_codec(codec)
    _check_int("servers", servers, 1, allow_none=True)
    if servers is not None and strategy != "ps":
        raise ValueError(f"servers={servers} only applies to strategy='ps', not {strategy!r}")
    _check_int("partitions", partitions, 1, allow_none=True)
    if partitions is not None and partitions > MAX_PARTITIONS:
        raise ValueError(f"partitions={partitions} is more than the supported maximum {MAX_PARTITIONS}")
    _check_bool("two_way", two_way)
    _check_bool("error_feedback", error_feedback)
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
    _check_int("bucket_bytes", bucket_bytes, 0, allow_none=True)
    _check_int("seed", seed, 0)
    specs = tensor_specs(tensors)
    bucket_bytes = DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes

    names = {s.name for s in specs}
    builder = GraphBuilder(nx.DiGraph())
    buckets: list[Bucket] = []
    default_parts = module.default_partitions(workers, servers)
    for index, group in enumerate(make_buckets(specs, bucket_bytes)):
        if len(group) == 1:
            name = group[0].name
        else:
            name = f"bucket{index}"
            while name in names:
                name = "_" + name
        members, offset = [], 0
        for spec in group:
            members.append(Member(spec, offset))
            offset += spec.numel
        wanted = partitions or max(1, min(default_parts, -(-offset // MIN_PARTITION_NUMEL)))
        bucket = Bucket(name=name, members=members, strategy=strategy, codec=codec_obj,
                        partitions=split_even(offset, wanted), priority=index, two_way=two_way,
                        servers=servers if strategy == "ps" else None, error_feedback=error_feedback)
        buckets.append(bucket)
        module.expand(builder, Unit(
            tensor=name, partitions=tuple(bucket.partitions), workers=workers, codec=codec_obj,
            error_feedback=error_feedback, divisor=workers if op == "mean" else 1, priority=index,
            servers=bucket.servers, two_way=two_way))
    options = dict(workers=workers, strategy=strategy, codec=codec_obj.spec(), servers=servers,
                   partitions=partitions, two_way=two_way, error_feedback=error_feedback, op=op,
                   bucket_bytes=bucket_bytes, seed=seed)
    return SyncPlan(graph=builder.graph, tensors=specs, buckets=buckets, workers=workers,
                    codecs=builder.codecs, options=options)
