"""How one tensor's sync becomes a sub-graph of primitives: ``ps``, ``ring`` and ``allgather``.

Each strategy module provides ``expand(builder, unit)`` and ``default_partitions(workers, servers)``.
"""
from __future__ import annotations

from types import ModuleType

from . import allgather, ps, ring
from .base import OPS, GraphBuilder, Unit, actor_rank, server, stable_hash, worker

STRATEGIES: dict[str, ModuleType] = {"ps": ps, "ring": ring, "allgather": allgather}


def get_strategy(name: str) -> ModuleType:
    """The strategy module registered as ``name``; ValueError naming the choices otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"strategy must be a string, got {type(name).__name__}")
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; expected one of {sorted(STRATEGIES)}") from None


__all__ = ["OPS", "STRATEGIES", "GraphBuilder", "Unit", "actor_rank", "get_strategy", "server", "stable_hash",
           "worker"]
