"""``build_plan``: the one entry point that makes a plan, fixed or planned.

A fixed choice (one strategy and codec for every bucket) is assembled here without importing the planner;
``strategy="auto"``, ``codec="auto"``, lists of either, or ``partitions="auto"`` hand the choice to
:func:`casync.planner.choose_plan`, which assembles the plan it picks the same way.
"""
from __future__ import annotations

from typing import Any, Sequence

from casync.primitives import feedback
from casync.primitives.codecs import Codec, get_codec
from casync.strategies import get_strategy

from .plan.assemble import DEFAULT_BUCKET_BYTES, BucketChoice, assemble_plan, given_groups, make_buckets, name_buckets
from .plan.checks import check_bool, check_int, check_nonfinite, check_op, check_partitions
from .plan.syncplan import SyncPlan
from .plan.tensors import tensor_specs


def _is_planned(strategy: Any, codec: Any, partitions: Any) -> bool:
    return (strategy == "auto" or isinstance(strategy, (list, tuple)) or (isinstance(codec, str) and codec == "auto")
            or isinstance(codec, list) or (isinstance(partitions, str) and partitions == "auto"))


def build_plan(
    tensors: Any,
    workers: int = 4,
    strategy: str = "ring",
    codec: str | tuple | Codec | None = "onebit",
    servers: int | None = None,
    partitions: int | None = None,
    two_way: bool = True,
    error_feedback: bool | str = "auto",
    op: str = "mean",
    bucket_bytes: int | None = None,
    seed: int = 0,
    cluster: Any = None,
    profile: Any = None,
    ready_times: Any = None,
    nonfinite: str = "raise",
    buckets: Sequence[Sequence[str]] | None = None,
) -> SyncPlan:
    """Build the sync plan of ``tensors`` across ``workers``.

    ``tensors``: dict name->shape, list of (name, shape), a torch.nn.Module or a built-in model name.
    See the README for every option; bad values raise ``TypeError``/``ValueError`` naming the option.

    ``strategy="auto"`` (or a list of names), ``codec="auto"`` (or a list of codec specs) or
    ``partitions="auto"`` let the planner (:func:`casync.planner.choose_plan`) choose per bucket, for
    ``cluster`` (a :class:`~casync.sim.costmodel.ClusterModel`), ``profile`` and ``ready_times`` (tensor ->
    second its gradient is ready); fixed choices ignore those three.

    ``error_feedback``: ``"auto"`` (default) keeps residuals where that is sound — plain error feedback for
    contractive codecs, error feedback on the contractive version of unbiased stochastic ones (terngrad,
    qsgd) — and none for a registered codec that declares neither; ``True`` asks for it everywhere (an
    error for such a codec), ``False`` turns it off.  See :mod:`casync.primitives.feedback`.

    ``nonfinite``: what engines do when a gradient holds NaN/Inf — ``"raise"`` a
    :class:`~casync.errors.NonFiniteGradientError`, ``"skip"`` the step on every worker, or ``"propagate"``
    the values to every worker's result (see :mod:`casync.engines.nonfinite`).

    ``buckets``: the gradient buckets, as lists of tensor names in backward order (each tensor in exactly one;
    say, a DDP job's own), used as they are instead of fusing tensors up to ``bucket_bytes`` (then ignored).
    """
    check_nonfinite(nonfinite)
    if _is_planned(strategy, codec, partitions):
        if servers is not None:
            raise ValueError(f"servers={servers} cannot be combined with automatic planning (the planner uses "
                             "co-located PS); choose the strategy yourself to use dedicated servers")
        from .planner import choose_plan  # only planned builds import the planner

        options = dict(workers=workers, strategy=strategy if isinstance(strategy, str) else list(strategy),
                       codec=codec if isinstance(codec, str) and codec == "auto" else
                       [get_codec(c).spec() for c in codec] if isinstance(codec, list) else get_codec(codec).spec(),
                       partitions=partitions, servers=None, nonfinite=nonfinite)
        return choose_plan(tensors, workers, cluster, profile,
                           strategies=strategy if strategy == "auto" or isinstance(strategy, (list, tuple))
                           else (strategy,), codecs=codec, partitions=partitions, ready_times=ready_times,
                           two_way=two_way, error_feedback=error_feedback, op=op, bucket_bytes=bucket_bytes,
                           seed=seed, options=options, buckets=buckets)
    workers = check_int("workers", workers, 1)
    strategy_obj = get_strategy(strategy)  # validates the name
    codec_obj = get_codec(codec)
    servers = check_int("servers", servers, 1, allow_none=True)
    if servers is not None and not strategy_obj.takes_servers:
        raise ValueError(f"servers={servers} only applies to a strategy with servers (ps), not {strategy!r}")
    partitions = check_partitions(partitions)
    check_bool("two_way", two_way)
    if not two_way and not strategy_obj.takes_servers:
        raise ValueError(f"two_way=False only applies to a strategy with servers (ps: the servers send the aggregate "
                         f"back uncompressed), not {strategy!r}")
    feedback.check(error_feedback)
    check_op(op)
    bucket_bytes = check_int("bucket_bytes", bucket_bytes, 0, allow_none=True)
    seed = check_int("seed", seed, 0)
    specs = tensor_specs(tensors)
    if buckets is not None:
        groups = name_buckets(specs, given_groups(specs, buckets))
        bucket_bytes = None
    else:
        bucket_bytes = DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes
        groups = name_buckets(specs, make_buckets(specs, bucket_bytes))
    choice = BucketChoice(strategy=strategy, codec=codec_obj, partitions=partitions, two_way=two_way,
                          servers=servers)
    options = dict(workers=workers, strategy=strategy, codec=codec_obj.spec(), servers=servers,
                   partitions=partitions, two_way=two_way, error_feedback=error_feedback, op=op,
                   bucket_bytes=bucket_bytes, seed=seed, nonfinite=nonfinite,
                   **({"buckets": "given"} if buckets is not None else {}))
    return assemble_plan(specs, workers, groups, [choice] * len(groups), error_feedback=error_feedback, op=op,
                         options=options)
