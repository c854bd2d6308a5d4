"""The simulator's side of a comparison: plans for grid cells and their predicted sync times.

:func:`predict` is the one place the benchmark calls the simulator, so a change of the cost model's
interface is absorbed here.  Large clusters are simulated with the compact symmetric templates
(``assemble_plan(..., compact=True)``): one representative worker, O(N) ops per bucket.
"""
from __future__ import annotations

from typing import Any

from casync.primitives.codecs import get_codec

from ..plan.assemble import (DEFAULT_BUCKET_BYTES, BucketChoice, assemble_plan, compact_is_exact, make_buckets,
                             name_buckets)
from ..build import build_plan
from ..plan.syncplan import SyncPlan
from ..plan.tensors import tensor_specs
from ..sim.costmodel import ClusterModel, Profile
from ..sim.simulator import Timeline, simulate
from .labels import plan_arguments, split_transport


def predict(plan: SyncPlan, cluster: ClusterModel, profile: Profile | None = None) -> Timeline:
    """Predicted timeline of one sync of ``plan`` on ``cluster``, all gradients ready at time 0."""
    return simulate(plan, cluster, profile)


def predicted_sync_s(timeline: Timeline) -> float:
    """The predicted counterpart of the measured sync span: first op to last op."""
    return timeline.sync_time()


def make_plan(model: str, workers: int, strategy: str, codec: str, codecs: tuple[str, ...], cluster: ClusterModel,
              seed: int = 0, profile: Profile | None = None, strategies: tuple[str, ...] = ()) -> SyncPlan:
    """The executable plan of one grid cell (the planner's for ``auto``, planning for ``cluster`` from the model
    alone, among the strategies of the grid's fixed rows ``strategies`` and its codecs ``codecs``)."""
    args = plan_arguments(strategy, codec, codecs, strategies)
    if split_transport(strategy)[0] == "auto":
        return build_plan(model, workers=workers, cluster=cluster, profile=profile, seed=seed, **args)
    return build_plan(model, workers=workers, seed=seed, **args)


def sim_plan(model: str, workers: int, strategy: str, codec: str, codecs: tuple[str, ...], cluster: ClusterModel,
             profile: Profile | None = None, strategies: tuple[str, ...] = ()) -> SyncPlan:
    """The plan whose simulation predicts a simulated-grid cell: its compact template where that is exact (the
    same buckets and partitions, on a cluster where workers are interchangeable), else the full plan.

    ``auto``: the planner chooses per bucket for ``cluster``; its choices are re-assembled as templates only
    if that changes no partition count.
    """
    specs = tensor_specs(model)
    if strategy == "auto":
        chosen = make_plan(model, workers, strategy, codec, codecs, cluster, profile=profile, strategies=strategies)
        groups = [(b.name, [m.spec for m in b.members]) for b in chosen.buckets]
        choices = [BucketChoice(strategy=b.strategy, codec=b.codec, partitions=len(b.partitions), two_way=b.two_way,
                                servers=b.servers, note=b.note) for b in chosen.buckets]
        options = dict(chosen.options)
    else:
        chosen = None
        args = plan_arguments(strategy, codec, codecs)
        groups = name_buckets(specs, make_buckets(specs, DEFAULT_BUCKET_BYTES))
        choice = BucketChoice(strategy=args["strategy"], codec=get_codec(args["codec"]),
                              partitions=args.get("partitions"), two_way=args.get("two_way", True))
        choices = [choice] * len(groups)
        options = {"strategy": strategy, "codec": codec}
    if cluster.asymmetry(workers) is None and compact_is_exact(workers, groups, choices):
        return assemble_plan(specs, workers, groups, choices, compact=True, options=options)
    return chosen if chosen is not None else assemble_plan(specs, workers, groups, choices, options=options)


def plan_choices(plan: SyncPlan) -> list[dict[str, Any]]:
    """Per bucket: what the plan does with it (the planner's choices, for the JSON)."""
    return [{"bucket": b.name, "numel": b.numel, "strategy": b.strategy, "codec": str(b.codec),
             "partitions": len(b.partitions), "two_way": b.two_way, "note": b.note} for b in plan.buckets]
