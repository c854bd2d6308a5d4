"""casync: compression-aware gradient synchronization as a task graph of encode/send/recv/merge/decode.

    plan = casync.build_plan("resnet50", workers=4, strategy="ring", codec="onebit")
    print(plan.summary())
    out = casync.LocalEngine(plan).sync(grads)
"""
from primitives.codecs import Codec, available_codecs, get_codec, register_codec

from .engines.local import LocalEngine
from .engines.nonfinite import NonFiniteReport, SyncOutput
from .errors import (
    NonFiniteGradientError,
    PlanFormatError,
    ReplicaMismatchError,
    SyncError,
    SyncTimeoutError,
    WorkerLostError,
)
from .plan.build import build_plan
from .plan.models import model_names
from .plan.specs import Bucket, TensorSpec
from .plan.syncplan import SyncPlan
from .sim.costmodel import ClusterModel, Profile
from .sim.simulator import Timeline, simulate

__version__ = "0.1.0"


def __getattr__(name: str):
    """``casync.RayEngine`` / ``casync.Trainer`` without importing Ray or torch until they are used."""
    if name == "RayEngine":
        from .runtime.ray_engine import RayEngine

        return RayEngine
    if name == "Trainer":
        from .training import Trainer

        return Trainer
    if name == "profile":
        from .sim.profiler import profile

        return profile
    if name in ("choose_plan", "backward_ready_times"):
        from . import planner

        return getattr(planner, name)
    raise AttributeError(f"module 'casync' has no attribute {name!r}")

__all__ = ["Bucket", "ClusterModel", "Codec", "LocalEngine", "Profile", "RayEngine", "Timeline", "backward_ready_times", "choose_plan", "simulate", "profile", "ReplicaMismatchError", "SyncError", "SyncPlan", "SyncTimeoutError",
           "NonFiniteGradientError", "NonFiniteReport", "PlanFormatError", "SyncOutput",
           "TensorSpec", "Trainer", "WorkerLostError", "available_codecs", "build_plan", "get_codec", "model_names",
           "register_codec"]
