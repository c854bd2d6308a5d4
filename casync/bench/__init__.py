"""Strategy comparison: casync's strategies x codecs on RayEngine against gloo/DDP baselines, and simulated.

    from casync.bench import QUICK, local_setup, run_bench, write_report
    result = run_bench(QUICK, local_setup())
    write_report(result, "out/")

``casync bench`` and ``benchmarks/compare_strategies.py`` are the command line over the same code
(:mod:`casync.bench.cli`); ``benchmarks/netem`` runs it over emulated slow links (:func:`netem_setup`).
"""
from .grid import FULL, QUICK, Grid
from .report import write_report
from .runner import BenchResult, Row, SimRow, run_bench
from .setup import Setup, local_setup, netem_setup

__all__ = ["FULL", "QUICK", "BenchResult", "Grid", "Row", "Setup", "SimRow", "local_setup", "netem_setup",
           "run_bench", "write_report"]
