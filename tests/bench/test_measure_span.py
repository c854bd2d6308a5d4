"""What the benchmark times on RayEngine and what its report says it used (no Ray: a stand-in engine)."""
from __future__ import annotations

import pytest

from casync.bench.measure import measure_plan, step_span, sync_span


def _rows():
    # worker:0 starts its step at 0 and scans its gradient for 8 ms before its first op; worker:1 starts at 1
    return [dict(op="load", actor="worker:0", start=0.000, end=0.008),
            dict(op="load", actor="worker:1", start=0.001, end=0.010),
            dict(op="encode", actor="worker:0", start=0.008, end=0.012),
            dict(op="decode", actor="worker:1", start=0.030, end=0.040)]


def test_the_step_span_counts_the_actors_scan_of_their_gradients():
    assert step_span(_rows()) == pytest.approx(0.040)
    assert sync_span(_rows()) == pytest.approx(0.032)  # the calibration's ops-only span, unchanged
    with pytest.raises(ValueError):
        step_span([dict(op="load", actor="worker:0", start=0.0, end=0.01)])


def test_measure_plan_times_casync_from_the_first_actors_start_of_the_step(monkeypatch):
    """The bench's casync sync time left out each step's NaN/Inf scan (the ``load`` row): casync work the
    baselines' spans have no counterpart of dropped, which flattered every casync row's ×gloo."""
    import numpy as np

    import casync.runtime.ray_engine as ray_engine

    class Plan:
        workers = 2
        buckets = []

    class Engine:
        calls_per_step = 2

        def __init__(self, *args, **kwargs):
            self.step = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def actor_nodes(self):
            return {"worker:0": "n0", "worker:1": "n1"}

        def run_flat(self, flats):
            self.step += 1
            return [{"b": np.zeros(2, np.float32)}, {"b": np.zeros(2, np.float32)}]

        def timeline(self, step):
            return _rows()

    class Store:
        def refs(self, plan, nodes):
            return [None, None]

    monkeypatch.setattr(ray_engine, "RayEngine", Engine)
    run = measure_plan(Plan(), Store(), None, address=None, iters=3, warmup=1)
    assert run.sync_s == pytest.approx([0.040] * 3)


def test_the_simulated_grid_names_the_profile_it_was_predicted_with(tmp_path):
    """The report said "with the packaged profile" for a simulated grid predicted with --profile's costs."""
    from casync.bench.grid import Grid
    from casync.bench.report import render_markdown
    from casync.bench.runner import BenchResult, SimRow, run_bench
    from casync.bench.setup import local_setup
    from casync.sim.costmodel import Profile

    grid = Grid(models=("tiny",), workers=(2,), strategies=("ring",), codecs=("onebit",), baselines=(), hooks=(),
                sim_workers=(8,), sim_bandwidths_gbps=(1.0,))
    sim = SimRow(model="tiny", workers=8, bandwidth_gbps=1.0, strategy="ring", codec="onebit", predicted_s=0.01,
                 wire_bytes=1, dense_wire_bytes=32, compression=32.0)
    result = BenchResult(setup=local_setup(), grid=grid, rows=[], sim_rows=[sim], machine={}, command="", seconds=0,
                         iters=1, warmup=0)
    assert "with the packaged profile" in render_markdown(result, [])
    path = Profile.default().save(tmp_path / "p.json")
    given = run_bench(grid.with_(models=(), workers=(), sim_models=("tiny",)), local_setup(), simulate=True, progress=False,
                      profile=Profile.load(path), profile_source=str(path))
    assert given.sim_rows and str(path) in given.sim_predicted_with
    given.sim_rows, given.grid = [sim], grid
    text = render_markdown(given, [])
    assert "with the packaged profile" not in text and str(path) in text.split("## Simulated grid")[1]
