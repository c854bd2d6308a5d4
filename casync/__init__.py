"""casync: compression-aware gradient synchronization as a task graph of encode/send/recv/merge/decode.

    plan = casync.build_plan("resnet50", workers=4, strategy="ring", codec="onebit")
    print(plan.summary())
    out = casync.LocalEngine(plan).sync(grads)
"""
from .layout import map_source_checkout

map_source_checkout()  # a checkout on PYTHONPATH, not installed: casync.primitives is its primitives/ folder

from casync.primitives.codecs import Codec, available_codecs, get_codec, register_codec
from casync.strategies import Strategy, available_strategies, get_strategy, register_strategy

from .engines.contract import Engine
from .engines.local import LocalEngine
from .engines.nonfinite import NonFiniteReport, SyncOutput
from .errors import (
    NonFiniteGradientError,
    PlanError,
    PlanFormatError,
    PlanMismatchError,
    ReplicaMismatchError,
    ResourcesUnavailableError,
    SyncError,
    SyncTimeoutError,
    WorkerLostError,
)
from .build import build_plan
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
    if name == "backward_ready_times":
        from .plan.ready import backward_ready_times

        return backward_ready_times
    if name == "choose_plan":
        from .planner.choose import choose_plan

        return choose_plan
    raise AttributeError(f"module 'casync' has no attribute {name!r}")

__all__ = ["Bucket", "ClusterModel", "Codec", "Engine", "LocalEngine", "NonFiniteGradientError", "NonFiniteReport",
           "PlanError", "PlanFormatError", "PlanMismatchError", "Profile", "RayEngine", "ReplicaMismatchError", "ResourcesUnavailableError", "Strategy", "SyncError",
           "SyncOutput", "SyncPlan", "SyncTimeoutError", "TensorSpec", "Timeline", "Trainer", "WorkerLostError",
           "available_codecs", "available_strategies", "backward_ready_times", "build_plan", "choose_plan",
           "get_codec", "get_strategy", "model_names", "profile", "register_codec", "register_strategy", "simulate"]
