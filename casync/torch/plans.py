"""The sync options of the PyTorch integration, and the plan they make for a model's gradient buckets.

A DDP script already decides its gradient buckets (``bucket_cap_mb``, rebuilt by DDP in the order gradients
became ready in the first iteration); the hook builds its plan with exactly those buckets, so each DDP bucket is
one plan bucket whose flat buffer is DDP's own.  ``strategy``/``codec`` ``"auto"`` (or lists) hand the choice to
the planner (``cluster=``, ``profile=``, ``ready_times=``), per bucket of those same buckets (or of its own with
``bucket_bytes=``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from casync.primitives import feedback
from casync.primitives.codecs import get_codec
from casync.strategies import get_strategy

from ..plan.assemble import BucketChoice, assemble_plan, name_buckets
from ..build import build_plan
from ..plan.checks import check_bool, check_int, check_nonfinite, check_op, check_partitions
from ..plan.specs import TensorSpec
from ..plan.syncplan import SyncPlan

#: build_plan options a caller may pass through ``**plan_options``
PLAN_OPTIONS = ("partitions", "two_way", "op", "seed", "cluster", "profile", "ready_times", "bucket_bytes", "servers")


def _is_auto(value: Any) -> bool:
    return (isinstance(value, str) and value == "auto") or isinstance(value, (list, tuple))


@dataclass
class SyncOptions:
    """What every rank passes to ``CasyncState`` / ``DistributedOptimizer``: validated once, kept in checkpoints."""

    strategy: Any = "ring"
    codec: Any = "onebit"
    error_feedback: bool | str = "auto"
    min_compress_bytes: int = 0
    nonfinite: str = "propagate"
    partitions: Any = None
    two_way: bool = True
    op: str = "mean"
    seed: int = 0
    bucket_bytes: int | None = None
    cluster: Any = None
    profile: Any = None
    ready_times: Any = None

    @classmethod
    def make(cls, strategy: Any, codec: Any, error_feedback: bool | str, min_compress_bytes: int, nonfinite: str,
             plan_options: dict[str, Any], *, fixed_buckets: bool) -> "SyncOptions":
        """Check every option; ``fixed_buckets``: the caller's buckets are given (DDP's), so ``bucket_bytes``
        only applies when the planner fuses tensors itself."""
        unknown = sorted(set(plan_options) - set(PLAN_OPTIONS))
        if unknown:
            raise TypeError(f"unknown option(s) {unknown}; casync.torch takes {list(PLAN_OPTIONS[:-1])} besides its "
                            "own arguments")
        if plan_options.get("servers") is not None:
            raise ValueError("dedicated PS servers (servers=...) need processes of their own, and casync.torch runs on "
                             "the training ranks only: use strategy='ps' without servers (co-located on the ranks)")
        planned = _is_auto(strategy) or _is_auto(codec) or plan_options.get("partitions") == "auto"
        if not planned:
            get_strategy(strategy)  # names the registered ones
            get_codec(None if codec == "none" else codec)
            if plan_options.get("cluster") is not None:
                raise ValueError("cluster= is for the planner: pass strategy='auto' (and/or codec='auto') with it")
        feedback.check(error_feedback)
        min_compress_bytes = check_int("min_compress_bytes", min_compress_bytes, 0)
        if planned and min_compress_bytes:
            raise ValueError("min_compress_bytes applies to a fixed codec; with 'auto' the planner decides per bucket "
                             "whether compression pays (selective compression)")
        check_nonfinite(nonfinite)
        options = cls(strategy=strategy, codec=codec, error_feedback=error_feedback,
                      min_compress_bytes=min_compress_bytes, nonfinite=nonfinite)
        if "partitions" in plan_options and plan_options["partitions"] != "auto":
            options.partitions = check_partitions(plan_options["partitions"])
        elif "partitions" in plan_options:
            options.partitions = "auto"
        if "two_way" in plan_options:
            check_bool("two_way", plan_options["two_way"])
            options.two_way = plan_options["two_way"]
        if "op" in plan_options:
            check_op(plan_options["op"])
            options.op = plan_options["op"]
        options.seed = check_int("seed", plan_options.get("seed", 0), 0)
        if plan_options.get("bucket_bytes") is not None:
            if fixed_buckets and not planned:
                raise ValueError("bucket_bytes does not apply to the DDP hook: casync syncs DDP's own buckets; set "
                                 "DistributedDataParallel(bucket_cap_mb=...) instead")
            options.bucket_bytes = check_int("bucket_bytes", plan_options["bucket_bytes"], 0)
        for key in ("cluster", "profile", "ready_times"):
            setattr(options, key, plan_options.get(key))
        return options

    @property
    def planned(self) -> bool:
        return _is_auto(self.strategy) or _is_auto(self.codec) or self.partitions == "auto"

    def config(self) -> dict[str, Any]:
        """The options as plain data (what ranks compare and what a checkpoint records)."""
        codec = self.codec if _is_auto(self.codec) else list(get_codec(None if self.codec == "none" else self.codec)
                                                            .spec())
        return {"strategy": self.strategy, "codec": codec, "error_feedback": self.error_feedback,
                "min_compress_bytes": self.min_compress_bytes, "nonfinite": self.nonfinite,
                "partitions": self.partitions, "two_way": self.two_way, "op": self.op, "seed": self.seed,
                "bucket_bytes": self.bucket_bytes,
                "cluster": self.cluster.to_dict() if hasattr(self.cluster, "to_dict") else self.cluster}


def plan_for_buckets(options: SyncOptions, buckets: Sequence[Sequence[tuple[str, tuple[int, ...]]]], workers: int,
                     ready_times: Mapping[str, float] | None = None) -> SyncPlan:
    """The plan of ``buckets`` (parameter (name, shape) lists in the order backward fills them; each list one
    bucket, members in their order in the bucket's flat buffer) across ``workers`` ranks.

    Fixed choices keep the buckets as given; buckets smaller than ``min_compress_bytes`` go uncompressed.  With
    ``"auto"`` the planner chooses per bucket for these same buckets (so a DDP bucket stays one plan bucket, its
    buffer synced in place), or fuses the tensors into buckets of its own where ``bucket_bytes`` was given; it
    plans for the options' ``ready_times``, else for ``ready_times`` here (the hook's measured hand-over times)."""
    specs = [TensorSpec(name, tuple(int(d) for d in shape)) for group in buckets for name, shape in group]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"a parameter appears twice in the gradient buckets: "
                         f"{sorted({n for n in names if names.count(n) > 1})[:4]}")
    if options.planned:
        given = None if options.bucket_bytes is not None else [[name for name, _ in g] for g in buckets if g]
        return build_plan([(s.name, s.shape) for s in specs], workers=workers, strategy=options.strategy,
                          codec=options.codec, partitions=options.partitions, two_way=options.two_way,
                          error_feedback=options.error_feedback, op=options.op, bucket_bytes=options.bucket_bytes,
                          seed=options.seed, cluster=options.cluster, profile=options.profile,
                          ready_times=options.ready_times if options.ready_times is not None else ready_times,
                          nonfinite=options.nonfinite, buckets=given)
    codec = get_codec(None if options.codec == "none" else options.codec)
    plain = get_codec(None)
    groups, offset = [], 0
    for group in buckets:
        groups.append(specs[offset:offset + len(group)])
        offset += len(group)
    named = name_buckets(specs, [g for g in groups if g])
    choices = []
    for _, group in named:
        small = sum(s.nbytes for s in group) < options.min_compress_bytes
        choices.append(BucketChoice(strategy=options.strategy, codec=plain if small else codec,
                                    partitions=options.partitions, two_way=options.two_way,
                                    note="below min_compress_bytes: uncompressed" if small and not codec.lossless
                                    else ""))
    plan_options = dict(workers=workers, strategy=options.strategy, codec=codec.spec(), servers=None,
                        partitions=options.partitions, two_way=options.two_way, error_feedback=options.error_feedback,
                        op=options.op, bucket_bytes=None, seed=options.seed, nonfinite=options.nonfinite,
                        min_compress_bytes=options.min_compress_bytes, buckets="given")
    return assemble_plan(specs, workers, named, choices, error_feedback=options.error_feedback, op=options.op,
                         options=plan_options)
