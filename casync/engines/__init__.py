"""Engines: the contract every interpreter of a plan honours, and the in-process reference engine.

``Engine`` (a Protocol) and ``EngineBase`` define ``sync``, ``run_flat``, ``state_dict``,
``load_state_dict``, ``timeline`` and ``close``; ``nonfinite`` holds the one NaN/Inf policy every engine
applies.  ``LocalEngine`` defines what a plan means; the Ray runtime (``casync.runtime``) must match it
bit for bit.
"""
from ..lazy import attach

# imported on first use: a runtime actor imports casync.engines.executor, never the reference engine
__getattr__, __dir__ = attach(__name__, {"Engine": ".contract", "EngineBase": ".contract", "LocalEngine": ".local",
                                         "NonFiniteReport": ".nonfinite", "SyncOutput": ".nonfinite"})

__all__ = ["Engine", "EngineBase", "LocalEngine", "NonFiniteReport", "SyncOutput"]
