"""``build_plan``: validate options, fuse small tensors into buckets, partition, expand each bucket."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from primitives.codecs import Codec, get_codec
from strategies import GraphBuilder, Unit, get_strategy

from .specs import Bucket, Member, TensorSpec, split_even
from .syncplan import SyncPlan
from .tensors import tensor_specs

DEFAULT_BUCKET_BYTES = 25 << 20  # 25 MiB, DDP's bucket_cap_mb: a Ray actor task costs ~1-2 ms end to end, so fewer,
# larger buckets win (ResNet-50: 5 buckets, which still pipeline)
MAX_PARTITIONS = 1 << 16
MIN_PARTITION_NUMEL = 16384  # default partitioning never cuts below 64 KiB: tiny parts cost latency, save nothing
MAX_PLAN_OPS = 2_000_000  # ~30 s to build and a few GB: beyond it, refuse at once instead of running for minutes


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> Any:
    """``value`` as a Python int (NumPy integers accepted), or None where allowed."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


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
    cluster: Any = None,
    profile: Any = None,
    ready_times: Any = None,
    nonfinite: str = "raise",
) -> SyncPlan:
    """Build the sync plan of ``tensors`` across ``workers`` with one strategy and codec for every bucket.

    ``tensors``: dict name->shape, list of (name, shape), a torch.nn.Module or a built-in model name.
    See the README for every option; bad values raise ``TypeError``/``ValueError`` naming the option.

    ``strategy="auto"`` (or a list of names), ``codec="auto"`` (or a list of codec specs) or
    ``partitions="auto"`` let the planner (:func:`casync.planner.choose_plan`) choose per bucket, for
    ``cluster`` (a :class:`~casync.costmodel.ClusterModel`), ``profile`` and ``ready_times`` (tensor ->
    second its gradient is ready); fixed choices ignore those three.

    ``nonfinite``: what engines do when a gradient holds NaN/Inf — ``"raise"`` a
    :class:`~casync.errors.NonFiniteGradientError`, ``"skip"`` the step on every worker, or ``"propagate"``
    the values to every worker's result (see :mod:`casync.nonfinite`).
    """
    from ..engines.nonfinite import check_mode

    check_mode(nonfinite)
    if strategy == "auto" or isinstance(strategy, (list, tuple)) or (isinstance(codec, str) and codec == "auto") \
            or isinstance(codec, list) or (isinstance(partitions, str) and partitions == "auto"):
        if servers is not None:
            raise ValueError(f"servers={servers} cannot be combined with automatic planning (the planner uses "
                             "co-located PS); choose the strategy yourself to use dedicated servers")
        from ..planner import choose_plan  # lazily: the planner imports this module

        options = dict(workers=workers, strategy=strategy if isinstance(strategy, str) else list(strategy),
                       codec=codec if isinstance(codec, str) and codec == "auto" else
                       [get_codec(c).spec() for c in codec] if isinstance(codec, list) else get_codec(codec).spec(),
                       partitions=partitions, servers=None, nonfinite=nonfinite)
        return choose_plan(tensors, workers, cluster, profile,
                           strategies=strategy if strategy == "auto" or isinstance(strategy, (list, tuple))
                           else (strategy,), codecs=codec, partitions=partitions, ready_times=ready_times,
                           two_way=two_way, error_feedback=error_feedback, op=op, bucket_bytes=bucket_bytes,
                           seed=seed, options=options)
    workers = _check_int("workers", workers, 1)
    get_strategy(strategy)  # validates the name
    codec_obj = get_codec(codec)
    servers = _check_int("servers", servers, 1, allow_none=True)
    if servers is not None and strategy != "ps":
        raise ValueError(f"servers={servers} only applies to strategy='ps', not {strategy!r}")
    partitions = _check_int("partitions", partitions, 1, allow_none=True)
    if partitions is not None and partitions > MAX_PARTITIONS:
        raise ValueError(f"partitions={partitions} is more than the supported maximum {MAX_PARTITIONS}")
    _check_bool("two_way", two_way)
    _check_bool("error_feedback", error_feedback)
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
    bucket_bytes = _check_int("bucket_bytes", bucket_bytes, 0, allow_none=True)
    seed = _check_int("seed", seed, 0)
    specs = tensor_specs(tensors)
    bucket_bytes = DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    groups = name_buckets(specs, make_buckets(specs, bucket_bytes))
    choice = BucketChoice(strategy=strategy, codec=codec_obj, partitions=partitions, two_way=two_way,
                          servers=servers)
    options = dict(workers=workers, strategy=strategy, codec=codec_obj.spec(), servers=servers,
                   partitions=partitions, two_way=two_way, error_feedback=error_feedback, op=op,
                   bucket_bytes=bucket_bytes, seed=seed, nonfinite=nonfinite)
    return assemble_plan(specs, workers, groups, [choice] * len(groups), error_feedback=error_feedback, op=op,
                         options=options)


@dataclass(frozen=True)
class BucketChoice:
    """How one bucket is synchronized: what a planner decides per bucket (``partitions=None``: default)."""

    strategy: str = "ring"
    codec: Codec = field(default_factory=lambda: get_codec(None))
    partitions: int | None = None
    two_way: bool = True
    servers: int | None = None
    note: str = ""


def name_buckets(specs: list[TensorSpec], groups: list[list[TensorSpec]]) -> list[tuple[str, list[TensorSpec]]]:
    """A bucket of one tensor takes its name; a fused one is ``bucket<i>`` (never clashing with a tensor)."""
    names = {s.name for s in specs}
    named = []
    for index, group in enumerate(groups):
        name = group[0].name if len(group) == 1 else f"bucket{index}"
        while len(group) > 1 and name in names:
            name = "_" + name
        named.append((name, group))
    return named


def effective_partitions(choice: BucketChoice, workers: int, numel: int) -> int:
    """The partition count a bucket gets: the choice's, else the strategy default, never below 64 KiB parts."""
    if choice.partitions:
        return choice.partitions
    default = get_strategy(choice.strategy).default_partitions(workers, choice.servers)
    return max(1, min(default, -(-numel // MIN_PARTITION_NUMEL)))


def estimated_ops(strategy: str, workers: int, parts: int, servers: int | None, compact: bool = False) -> int:
    """Upper bound on the ops a bucket expands to (the per-partition counts in the README), before building."""
    n = workers
    if compact:  # one representative worker; ring and PS templates expand one partition in every N
        groups = -(-parts // n)
        return {"ring": groups * (8 * n + 2), "ps": groups * (7 * n + 3)}.get(strategy, parts * (3 * n + 3))
    per = {"ring": 8 * n - 6 if n > 1 else 3, "allgather": 3 * n * n,
           "ps": 7 * n + 2 if servers else 7 * n - 4}.get(strategy, 8 * n * n)
    return parts * max(per, 3)


def assemble_plan(specs: list[TensorSpec], workers: int, groups: list[tuple[str, list[TensorSpec]]],
                  choices: list[BucketChoice], *, error_feedback: bool = True, op: str = "mean",
                  options: dict[str, Any] | None = None, compact: bool = False) -> SyncPlan:
    """Expand every bucket with its own :class:`BucketChoice` into one plan graph (the planner's entry point).

    ``compact=True`` expands symmetric templates (one representative worker, see ``strategies.compact``):
    O(N) ops per bucket instead of O(N^2), for simulating large clusters; engines refuse such plans.
    """
    from strategies.compact import TEMPLATES

    if len(choices) != len(groups):
        raise ValueError(f"{len(choices)} choices for {len(groups)} buckets")
    total = 0
    for (_, group), c in zip(groups, choices):
        numel = sum(s.numel for s in group)
        parts = len(split_even(numel, effective_partitions(c, workers, numel)))
        if compact and c.strategy == "ring":
            parts = workers * max(1, (c.partitions or workers) // workers)
        total += estimated_ops(c.strategy, workers, parts, c.servers if c.strategy == "ps" else None, compact)
    if total > MAX_PLAN_OPS:
        raise ValueError(f"this plan would have about {total:,} ops ({workers} workers, {len(groups)} buckets), more "
                         f"than the {MAX_PLAN_OPS:,} casync builds; use fewer partitions or workers, or "
                         "assemble_plan(..., compact=True) to simulate a large cluster")
    builder = GraphBuilder(nx.DiGraph())
    buckets: list[Bucket] = []
    for index, ((name, group), choice) in enumerate(zip(groups, choices)):
        module = get_strategy(choice.strategy)
        members, offset = [], 0
        for spec in group:
            members.append(Member(spec, offset))
            offset += spec.numel
        servers = choice.servers if choice.strategy == "ps" else None
        parts = effective_partitions(choice, workers, offset)
        if compact and choice.strategy == "ring":  # the template needs whole rotations: a multiple of N chunks
            parts = workers * max(1, (choice.partitions or workers) // workers)
        bucket = Bucket(name=name, members=members, strategy=choice.strategy, codec=choice.codec,
                        partitions=split_even(offset, parts),
                        priority=index, two_way=choice.two_way, servers=servers, error_feedback=error_feedback,
                        note=choice.note)
        buckets.append(bucket)
        expand = TEMPLATES[choice.strategy] if compact else module.expand
        expand(builder, Unit(
            tensor=name, partitions=tuple(bucket.partitions), workers=workers, codec=choice.codec,
            error_feedback=error_feedback, divisor=workers if op == "mean" else 1, priority=index,
            servers=servers, two_way=choice.two_way))
    return SyncPlan(graph=builder.graph, tensors=list(specs), buckets=buckets, workers=workers,
                    codecs=builder.codecs, options=dict(options or {}, workers=workers, op=op,
                                                        error_feedback=error_feedback), compact=compact)
