"""Plans: what a sync does, as plain data — built from tensors and per-bucket choices, checked, saved, drawn.

``casync.build.build_plan`` (the one entry point; ``casync.build_plan``) -> ``assemble_plan`` (fuse into
buckets, partition, expand with each bucket's strategy) -> ``lint`` (the IR's rules) -> a :class:`SyncPlan`.
The package does not import ``build`` itself: that module dispatches to the planner, which imports this one.
"""
from .assemble import BucketChoice, assemble_plan
from .lint import lint
from .specs import Bucket, Member, TensorSpec
from .syncplan import SyncPlan

__all__ = ["Bucket", "BucketChoice", "Member", "SyncPlan", "TensorSpec", "assemble_plan", "lint"]
