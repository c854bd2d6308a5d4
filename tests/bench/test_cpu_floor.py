"""benchmarks/cpu_floor.py: giving each emulated node cores of its own never slows a simulated configuration
down, and the shared setting's floor is the ops' and the data plane's threads' CPU over the host's cores.
Simulator only (no Ray)."""
from __future__ import annotations

from pathlib import Path

import pytest

from casync.sim.costmodel import Profile
from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
cf = load_benchmark("cpu_floor")


def test_own_cores_are_never_slower_and_the_shared_floor_is_the_cpu_over_host_cores():
    profiles = {"calibrated": Profile.load(ROOT / cf.CALIBRATED), "packaged": Profile.default()}
    rows = cf.simulate_grid("tiny", 2, (1.0, 10.0), profiles, host_cores=1, cores_per_node=cf.parse_cores("1,2,2:2"))
    assert len(rows) == 2 * 2 * len(cf.STRATEGIES) * len(cf.CODECS)
    for r in rows:
        a = r["a"]
        assert a["cluster"]["host_cores"] == 1 and a["op_cpu_s"] > 0
        assert a["floor_s"] == pytest.approx((a["op_cpu_s"] + a["thread_cpu_s"]) / 1)
        assert (a["thread_cpu_s"] > 0) == (r["profile"] == "calibrated")  # the data plane's threads, calibrated
        # the ops cannot finish before their CPU is spent (the threads' CPU may spill past the last op: it bounds
        # back-to-back syncs, which the floor is about)
        assert a["sync_s"] >= a["op_cpu_s"] / 1 * (1 - 1e-9)
        for b in ("b1", "b2"):
            assert r[b]["cluster"]["cores_per_node"] == int(b[1:]) and r[b]["cluster"]["host_cores"] is None
            assert r[b]["op_cpu_s"] == pytest.approx(a["op_cpu_s"])  # the same ops, other cores
            assert r[b]["sync_s"] <= a["sync_s"] * (1 + 1e-9), (r["strategy"], r["codec"], b)
        # two ops at once on an actor's own 2 cores: never slower than one at a time, and its floor halves at most
        assert r["b2x2"]["cluster"]["compute_lanes"] == 2
        assert r["b2x2"]["sync_s"] <= r["b2"]["sync_s"] * (1 + 1e-9), (r["strategy"], r["codec"])
        assert r["b2x2"]["floor_s"] >= r["b2"]["floor_s"] / 2 * (1 - 1e-9)
        standin = next(s for s in rows if (s["profile"], s["gbps"], s["strategy"], s["codec"])
                       == (r["profile"], r["gbps"], *cf.STANDIN))
        assert r["wire_mb_per_node"] > 0 and standin["link_floor_s"] == r["link_floor_s"]


def test_measured_rows_come_from_the_committed_direct_plane_runs():
    meas = cf.measured(ROOT / "benchmarks" / "results", "resnet50", 4, 1.0)
    runs = [run for values in meas.values() for run, _ in values]
    assert ("gloo-bucket", "") in meas and ("ring", "none") in meas
    assert "netem_1gbit_resnet50" not in runs  # the object-store era run, before the direct plane
