"""Plans: what a sync does, as plain data — built from tensors and per-bucket choices, checked, saved, drawn.

``casync.build.build_plan`` (the one entry point; ``casync.build_plan``) -> ``assemble_plan`` (fuse into
buckets, partition, expand with each bucket's strategy) -> ``lint`` (the IR's rules) -> a :class:`SyncPlan`.
The package does not import ``build`` itself: that module dispatches to the planner, which imports this one.
"""
from ..lazy import attach

# imported on first use: an actor that only unpickles a SyncPlan needs neither the assembler nor the linter
__getattr__, __dir__ = attach(__name__, {"BucketChoice": ".assemble", "assemble_plan": ".assemble", "lint": ".lint",
                                         "Bucket": ".specs", "Member": ".specs", "TensorSpec": ".specs",
                                         "SyncPlan": ".syncplan"})

__all__ = ["Bucket", "BucketChoice", "Member", "SyncPlan", "TensorSpec", "assemble_plan", "lint"]
