"""Fixed plans: fuse tensors into buckets, partition each bucket, and expand it with its strategy.

:func:`assemble_plan` is where every plan is made, whoever chose the per-bucket options (``build_plan``
for one strategy and codec everywhere, the planner for a mix).  ``compact=True`` expands the strategies'
symmetric templates (one representative worker, O(N) ops per bucket) for simulating large clusters.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence


from casync.primitives import feedback
from casync.primitives.codecs import Codec, get_codec
from casync.strategies import Unit, get_strategy

from .lint import lint
from .specs import Bucket, Member, TensorSpec, split_even
from .stamp import Graph, Template, gc_paused
from .syncplan import SyncPlan

DEFAULT_BUCKET_BYTES = 25 << 20  # 25 MiB, DDP's bucket_cap_mb: fewer, larger buckets win (ResNet-50: 5 buckets,
# which still pipeline)
MIN_PARTITION_NUMEL = 16384  # default partitioning never cuts below 64 KiB: tiny parts cost latency, save nothing
MAX_PLAN_OPS = 2_000_000  # ~30 s to build and a few GB: beyond it, refuse at once instead of running for minutes


@dataclass(frozen=True)
class BucketChoice:
    """How one bucket is synchronized: what a planner decides per bucket (``partitions=None``: default)."""

    strategy: str = "ring"
    codec: Codec = field(default_factory=lambda: get_codec(None))
    partitions: int | None = None
    two_way: bool = True
    servers: int | None = None
    note: str = ""


def structure_key(workers: int, divisor: int, choice: BucketChoice, parts: int, servers: int | None, ef: bool,
                  compact: bool) -> tuple:
    """What a bucket's sub-graph depends on besides its name and partition sizes: buckets with the same key
    share one template (:mod:`casync.plan.stamp`)."""
    return (workers, divisor, choice.strategy, str(choice.codec), parts, choice.two_way, servers, ef, compact)


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


def given_groups(specs: list[TensorSpec], buckets: Sequence[Sequence[str]]) -> list[list[TensorSpec]]:
    """``buckets`` (lists of tensor names) as groups of ``specs``; every tensor must be in exactly one bucket and
    no bucket empty, or ValueError says which."""
    by_name = {s.name: s for s in specs}
    if isinstance(buckets, (str, bytes)) or not all(isinstance(b, (list, tuple)) for b in buckets):
        raise TypeError("buckets must be a list of lists of tensor names")
    seen = Counter(n for b in buckets for n in b)
    unknown = [n for n in seen if n not in by_name]
    twice = sorted(n for n, count in seen.items() if count > 1)
    missing = [s.name for s in specs if s.name not in seen]
    empty = [i for i, b in enumerate(buckets) if not b]
    if unknown or twice or missing or empty:
        problems = [f"{what}: {items[:4]}" for what, items in (("unknown tensors", unknown), ("in two buckets", twice),
                                                                ("in no bucket", missing), ("empty buckets", empty))
                    if items]
        raise ValueError(f"buckets must hold every tensor exactly once; {'; '.join(problems)}")
    return [[by_name[n] for n in b] for b in buckets]


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


def bucket_priority(index: int, count: int) -> int:
    """The priority of the ``index``-th of ``count`` buckets (backward order): lower runs first, and the
    buckets the next forward pass needs first (the last in backward order) come first, as in ByteScheduler."""
    return count - 1 - index


def _partitions(choice: BucketChoice, workers: int, numel: int, compact: bool, name: str = "") -> int:
    parts = effective_partitions(choice, workers, numel)
    if compact:
        parts = get_strategy(choice.strategy).compact_partitions(workers, parts, choice.partitions)
        if parts > max(1, numel):
            raise ValueError(f"bucket {name!r} has {numel} elements, too few for the {parts} partitions a compact "
                             f"{choice.strategy} template needs (whole rotations of {workers} workers); fuse small "
                             "tensors into larger buckets (bucket_bytes) or simulate the full plan")
    return parts


def bucket_partitions(choice: BucketChoice, workers: int, numel: int, compact: bool = False,
                      name: str = "") -> list[tuple[int, int]]:
    """The partitions ``assemble_plan`` gives a bucket of ``numel`` elements with this choice."""
    return split_even(numel, _partitions(choice, workers, numel, compact, name))


def compact_is_exact(workers: int, groups: list[tuple[str, list[TensorSpec]]], choices: list[BucketChoice]) -> bool:
    """Whether ``assemble_plan(..., compact=True)`` of these buckets stands for exactly the plan
    ``compact=False`` builds: every strategy has a template for its configuration and no bucket's partitions
    had to be rounded up to whole rotations.  Simulated on a cluster where workers are interchangeable
    (``ClusterModel.asymmetry``), such a template gives the full plan's iteration time."""
    for (name, group), choice in zip(groups, choices):
        strategy = get_strategy(choice.strategy)
        servers = choice.servers if strategy.takes_servers else None
        if not strategy.has_compact(servers):
            return False
        numel = sum(s.numel for s in group)
        full = len(split_even(numel, _partitions(choice, workers, numel, False)))
        try:
            if _partitions(choice, workers, numel, True, name) != full:
                return False
        except ValueError:
            return False
    return True


def assemble_plan(specs: list[TensorSpec], workers: int, groups: list[tuple[str, list[TensorSpec]]],
                  choices: list[BucketChoice], *, error_feedback: feedback.ErrorFeedback = "auto", op: str = "mean",
                  options: dict[str, Any] | None = None, compact: bool = False,
                  templates: dict[tuple, Template] | None = None) -> SyncPlan:
    """Expand every bucket with its own :class:`BucketChoice` into one plan graph (the planner's entry point).

    ``compact=True`` expands symmetric templates (one representative worker, see ``Strategy.expand_compact``):
    O(N) ops per bucket instead of O(N^2), for simulating large clusters; engines refuse such plans.  Ring and
    PS templates need whole rotations, so their partitions are rounded up to a multiple of N (the buckets
    record what was used; :func:`compact_is_exact` says whether that changed anything), and a bucket with
    fewer elements than that is an error.  A strategy without an exact template for its configuration
    (PS with dedicated servers) raises ValueError rather than approximate.

    ``error_feedback`` (``"auto"``, True or False) is resolved per bucket by :func:`casync.primitives.feedback.resolve`
    (each bucket records the result); the plan's options keep what was asked.

    Buckets of one structure (strategy, codec, partition count, ...) are expanded once and stamped
    (:mod:`casync.plan.stamp`); ``templates`` is a cache of those shared between calls (the planner's).
    """
    if len(choices) != len(groups):
        raise ValueError(f"{len(choices)} choices for {len(groups)} buckets")
    total = 0
    for (name, group), c in zip(groups, choices):
        strategy = get_strategy(c.strategy)
        numel = sum(s.numel for s in group)
        parts = len(split_even(numel, _partitions(c, workers, numel, compact, name)))
        servers = c.servers if strategy.takes_servers else None
        total += strategy.compact_op_count(workers, parts) if compact else strategy.op_count(workers, parts, servers)
    if total > MAX_PLAN_OPS:
        raise ValueError(f"this plan would have about {total:,} ops ({workers} workers, {len(groups)} buckets), more "
                         f"than the {MAX_PLAN_OPS:,} casync builds; use fewer partitions or workers, or "
                         "assemble_plan(..., compact=True) to simulate a large cluster")
    with gc_paused():
        return _assemble(specs, workers, groups, choices, error_feedback, op, options, compact,
                         {} if templates is None else templates)


def _assemble(specs: list[TensorSpec], workers: int, groups: list[tuple[str, list[TensorSpec]]],
              choices: list[BucketChoice], error_feedback: feedback.ErrorFeedback, op: str,
              options: dict[str, Any] | None, compact: bool, templates: dict[tuple, Template]) -> SyncPlan:
    out = Graph()
    codecs: dict[str, Codec] = {}
    buckets: list[Bucket] = []
    divisor = workers if op == "mean" else 1
    for index, ((name, group), choice) in enumerate(zip(groups, choices)):
        strategy = get_strategy(choice.strategy)
        members, offset = [], 0
        for spec in group:
            members.append(Member(spec, offset))
            offset += spec.numel
        servers = choice.servers if strategy.takes_servers else None
        ef = feedback.resolve(choice.codec, error_feedback)
        priority = bucket_priority(index, len(groups))
        bucket = Bucket(name=name, members=members, strategy=choice.strategy, codec=choice.codec,
                        partitions=split_even(offset, _partitions(choice, workers, offset, compact, name)),
                        priority=priority, two_way=choice.two_way, servers=servers, error_feedback=ef,
                        note=choice.note)
        buckets.append(bucket)
        parts = tuple(bucket.partitions)
        # buckets of one structure share a template: built (and linted) once, stamped for each of them
        key = structure_key(workers, divisor, choice, len(parts), servers, ef, compact)
        template = templates.get(key)
        if template is None or not template.fits(name, parts):
            unit = Unit(bucket=name, partitions=parts, workers=workers, codec=choice.codec, error_feedback=ef,
                        divisor=divisor, priority=priority, servers=servers, two_way=choice.two_way)
            template = Template.build(strategy.expand_compact if compact else strategy.expand, unit)
            alone = SyncPlan(graph=template.graph(), tensors=list(group), buckets=[bucket], workers=workers,
                             codecs=template.codecs, compact=compact)
            lint(alone, attrs=False)  # the builder types every attribute; structure, codecs and outputs are checked
            out.adopt(template.built, name)  # this bucket is the builder's graph itself: no copy to stamp
            template.release()
            templates[key] = template
        else:
            template.stamp(out, name, priority, parts)
        codecs.update(template.codecs)
    plan = SyncPlan(graph=out.graph, tensors=list(specs), buckets=buckets, workers=workers,
                    codecs=codecs, options=dict(options or {}, workers=workers, op=op,
                                                error_feedback=error_feedback), compact=compact)
    return plan
