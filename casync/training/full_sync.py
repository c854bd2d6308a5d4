"""CD-SGD's periodic full-precision correction: which steps sync uncompressed, and the plan they sync with.

Shared by the Ray Trainer (``full_sync_every``) and ``casync.torch.DistributedOptimizer`` (``full_sync_every``,
``start_iter``); Ray-free.  A full-precision step runs the plan's uncompressed twin: the same buckets, strategies
and partitions with codec ``none``, which has no error feedback, so the residuals are kept for the next
compressed step."""
from __future__ import annotations

from casync.primitives.codecs import get_codec

from ..plan.assemble import BucketChoice, assemble_plan
from ..plan.syncplan import SyncPlan


def is_full_sync(step: int, every: int | None, start: int = 0) -> bool:
    """Whether step ``step`` (0-based) syncs uncompressed: one of the first ``start`` (a full-precision warm-up)
    or every ``every``-th ((step + 1) % every == 0: steps every-1, 2*every-1, ...)."""
    return step < start or (bool(every) and (step + 1) % every == 0)


def lossless_twin(plan: SyncPlan) -> SyncPlan:
    """The same buckets, strategies and partitions with codec ``none``: the plan of a full-precision step.
    Its node ids equal the plan's, so both share one timeline and one set of residual keys."""
    groups = [(b.name, [m.spec for m in b.members]) for b in plan.buckets]
    choices = [BucketChoice(strategy=b.strategy, codec=get_codec(None), partitions=len(b.partitions),
                            two_way=b.two_way, servers=b.servers) for b in plan.buckets]
    twin = assemble_plan(plan.tensors, plan.workers, groups, choices, error_feedback=plan.options["error_feedback"],
                         op=plan.options["op"], options=dict(plan.options, codec=("none", {})))
    if set(twin.graph.nodes) != set(plan.graph.nodes) or any(
            a.partitions != b.partitions for a, b in zip(twin.buckets, plan.buckets)):
        raise ValueError("full_sync_every: the uncompressed twin of this plan has a different structure")
    return twin
