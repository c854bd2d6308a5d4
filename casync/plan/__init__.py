"""Plans: what a sync does, as plain data — built from tensors and per-bucket choices, checked, saved, drawn.

``build_plan`` (the one entry point) -> ``assemble_plan`` (fuse into buckets, partition, expand with each
bucket's strategy) -> ``lint`` (the IR's rules) -> a :class:`SyncPlan`.
"""
from .assemble import BucketChoice, assemble_plan
from .build import build_plan
from .lint import lint
from .specs import Bucket, Member, TensorSpec
from .syncplan import SyncPlan

__all__ = ["Bucket", "BucketChoice", "Member", "SyncPlan", "TensorSpec", "assemble_plan", "build_plan", "lint"]
