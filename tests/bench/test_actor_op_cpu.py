"""benchmarks/actor_op_cpu.py's sum: each actor's op CPU by kind, averaged over actors, loads left out."""
from __future__ import annotations

import pytest

from tests.helpers import load_benchmark

load_benchmark("result_files")  # what the script imports as a sibling
aoc = load_benchmark("actor_op_cpu")


def test_op_cpu_is_summed_per_actor_and_kind_then_averaged_over_actors():
    rows = [dict(actor="worker:0", op="load", cpu=0.5), dict(actor="worker:0", op="encode", cpu=0.010),
            dict(actor="worker:0", op="encode", cpu=0.020), dict(actor="worker:0", op="decode", cpu=0.004),
            dict(actor="worker:1", op="encode", cpu=0.010), dict(actor="worker:1", op="recv", cpu=None),
            dict(actor="worker:1", op="decode", cpu=0.002)]
    got = aoc.op_cpu_by_kind(rows)
    assert got == pytest.approx({"decode": 0.003, "encode": 0.020, "total": 0.023})


def test_ops_in_flight_is_the_ops_wall_time_over_the_span_per_actor():
    rows = [dict(actor="worker:0", op="encode", start=0.0, end=2.0), dict(actor="worker:0", op="encode", start=1.0, end=3.0),
            dict(actor="worker:1", op="decode", start=2.0, end=4.0), dict(actor="worker:1", op="recv", start=0.0, end=4.0)]
    assert aoc.ops_in_flight(rows) == pytest.approx((4.0 + 2.0) / 4.0 / 2)
