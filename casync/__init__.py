"""casync: compression-aware gradient synchronization as a task graph of encode/send/recv/merge/decode.

    plan = casync.build_plan("resnet50", workers=4, strategy="ring", codec="onebit")
    print(plan.summary())
    out = casync.LocalEngine(plan).sync(grads)

Every public name is imported on first use (``casync.lazy``): a Ray actor or a gloo rank that imports one
runtime module does not pay for the planner, the simulator or networkx, and ``import casync`` imports neither
torch nor Ray.
"""
from .layout import map_source_checkout
from .lazy import attach

map_source_checkout()  # a checkout on PYTHONPATH, not installed: casync.primitives is its primitives/ folder

__version__ = "0.1.0"

#: public name -> the module that defines it (imported when the name is first read)
_SOURCES = {
    **dict.fromkeys(["Codec", "available_codecs", "get_codec", "register_codec"], "casync.primitives.codecs"),
    **dict.fromkeys(["Strategy", "available_strategies", "get_strategy", "register_strategy"], "casync.strategies"),
    "Engine": ".engines.contract",
    "LocalEngine": ".engines.local",
    **dict.fromkeys(["NonFiniteReport", "SyncOutput"], ".engines.nonfinite"),
    **dict.fromkeys(["NonFiniteGradientError", "PlanError", "PlanFormatError", "PlanMismatchError",
                     "ReplicaMismatchError", "ResourcesUnavailableError", "SyncError", "SyncTimeoutError",
                     "WorkerLostError"], ".errors"),
    "build_plan": ".build",
    "model_names": ".plan.models",
    **dict.fromkeys(["Bucket", "TensorSpec"], ".plan.specs"),
    "SyncPlan": ".plan.syncplan",
    **dict.fromkeys(["ClusterModel", "Profile"], ".sim.costmodel"),
    **dict.fromkeys(["Timeline", "simulate"], ".sim.simulator"),
    "RayEngine": ".runtime.ray_engine",  # imports Ray
    "Trainer": ".training",  # imports Ray and torch
    "profile": ".sim.profiler",
    "backward_ready_times": ".plan.ready",
    "choose_plan": ".planner.choose",
}

# the subpackages an eager ``import casync`` used to leave as attributes (``casync.sim.simulate`` after a bare
# ``import casync``); casync.torch and casync.runtime stay out: reading them imports torch or Ray
_SUBMODULES = ("build", "engines", "errors", "plan", "primitives", "schedule", "sim", "strategies", "table")

__getattr__, __dir__ = attach(__name__, _SOURCES, _SUBMODULES)
del attach

__all__ = ["Bucket", "ClusterModel", "Codec", "Engine", "LocalEngine", "NonFiniteGradientError", "NonFiniteReport",
           "PlanError", "PlanFormatError", "PlanMismatchError", "Profile", "RayEngine", "ReplicaMismatchError",
           "ResourcesUnavailableError", "Strategy", "SyncError", "SyncOutput", "SyncPlan", "SyncTimeoutError",
           "TensorSpec", "Timeline", "Trainer", "WorkerLostError", "available_codecs", "available_strategies",
           "backward_ready_times", "build_plan", "choose_plan", "get_codec", "get_strategy", "model_names", "profile",
           "register_codec", "register_strategy", "simulate"]
