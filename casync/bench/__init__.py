"""Strategy comparison: casync's strategies x codecs on RayEngine against gloo/DDP baselines, and simulated.

    from casync.bench import QUICK, local_setup, run_bench, write_report
    result = run_bench(QUICK, local_setup())
    write_report(result, "out/")

``casync bench`` and ``benchmarks/compare_strategies.py`` are the command line over the same code
(:mod:`casync.bench.cli`); ``benchmarks/netem`` runs it over emulated slow links (:func:`netem_setup`).
``casync tta`` (:mod:`casync.bench.tta`) trains real tasks with the same DDP rows and asks for time to accuracy.

The names below load on first use: a rank process that needs only ``casync.bench.baselines`` (or the
time-to-accuracy mode's rank) then starts without importing Ray, which the measured grid's modules import.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"FULL": "grid", "QUICK": "grid", "Grid": "grid", "write_report": "report", "BenchResult": "runner",
            "Row": "runner", "SimRow": "runner", "run_bench": "runner", "Setup": "setup", "local_setup": "setup",
            "netem_setup": "setup"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = sorted(_EXPORTS)
