"""How one bucket's sync becomes a sub-graph of primitives: one file per strategy, one registry.

    from casync.strategies import Strategy, register_strategy
    register_strategy(MyStrategy())          # build_plan(..., strategy="mine") from then on

Built in: ``ring`` (CaSync-Ring), ``ps`` (CaSync-PS, co-located or dedicated servers) and ``allgather``.
"""
from __future__ import annotations

if __name__ != "casync.strategies":  # the repository's strategies/ folder, imported by its bare name
    raise ImportError(f"strategies/ installs as casync.strategies: import that (a bare {__name__!r} would be a second "
                      "copy of its registry)")

from .allgather import AllGather
from .base import Strategy, Unit
from .builder import IDENTITY, GraphBuilder, stable_hash
from .ps import ParameterServer
from .ring import Ring

STRATEGIES: dict[str, Strategy] = {}


def register_strategy(strategy: Strategy, *, replace: bool = False) -> Strategy:
    """Make ``strategy`` available by its ``name`` everywhere (build_plan, planner, bench, CLI); returns it."""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"register_strategy needs a Strategy instance, got {type(strategy).__name__}")
    name = strategy.name
    if not isinstance(name, str) or not name or name == "auto" or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"a strategy needs a name of letters, digits, '-' or '_' (not 'auto'), got {name!r}")
    if name in STRATEGIES and not replace:
        raise ValueError(f"strategy {name!r} is already registered (replace=True to override)")
    STRATEGIES[name] = strategy
    return strategy


def unregister_strategy(name: str) -> None:
    """Remove a registered strategy (tests use this to clean up)."""
    STRATEGIES.pop(name, None)


def get_strategy(name: str) -> Strategy:
    """The strategy registered as ``name``; ValueError naming the choices otherwise (never a fallback)."""
    if not isinstance(name, str):
        raise TypeError(f"strategy must be a string, got {type(name).__name__}")
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; expected one of {sorted(STRATEGIES)}") from None


def available_strategies() -> list[str]:
    """Registered strategy names, in registration order."""
    return list(STRATEGIES)


for _builtin in (Ring(), ParameterServer(), AllGather()):
    register_strategy(_builtin)

#: the strategies every process has without registering anything
BUILT_IN: tuple[str, ...] = tuple(STRATEGIES)

__all__ = ["BUILT_IN", "IDENTITY", "STRATEGIES", "AllGather", "GraphBuilder", "ParameterServer", "Ring", "Strategy", "Unit",
           "available_strategies", "get_strategy", "register_strategy", "stable_hash", "unregister_strategy"]
