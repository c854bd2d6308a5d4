"""Time to accuracy: train a real task (``casync.tasks``) with casync's configurations and PyTorch's DDP hooks on
gloo ranks, and compare how soon, in training seconds, each reaches the accuracy DDP allreduce reaches at 80 % of
its steps (``casync tta``; issue #43).

    configs.py  the configurations, as plain data in one registry
    rank.py     one rank: train, time the steps only, evaluate on rank 0
    wire.py     bytes on the wire per step
    runner.py   the runs on the setup's ranks (casync.bench.ranks), failures recorded, the summary
    curves.py   target, time to target, speed-ups (pure functions of the curves)
    report.py   table, Markdown, JSON and plots
    cli.py      the command line
"""
from __future__ import annotations

from typing import Any

from .configs import CONFIGS, Config, default_configs, resolve
from .curves import reference_target, summarize, time_to_target


def __getattr__(name: str) -> Any:
    """``run_tta`` and ``TTAError`` load on first use (the driver's modules import Ray; a rank needs none of it)."""
    if name in ("TTAError", "run_tta"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CONFIGS", "Config", "TTAError", "default_configs", "reference_target", "resolve", "run_tta",
           "summarize", "time_to_target"]
