"""benchmarks/profile_deferred.py: its update, run on the committed measurement, gives the packaged profile's
``deferred`` costs, and its measurement has the shape the update reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
pd = load_benchmark("profile_deferred")
MEASURED = ROOT / "benchmarks" / "results" / "profile" / "deferred" / "measured.json"


def packaged() -> dict:
    return json.loads((ROOT / "casync" / "data" / "default_profile.json").read_text())


def test_the_committed_measurement_gives_the_packaged_deferred_costs():
    profile, measured = packaged(), json.loads(MEASURED.read_text())
    deferred = {name: list(c["deferred"]) for name, c in profile["codecs"].items() if "deferred" in c}
    assert set(deferred) == {"onebit", *measured["blocks"]}
    encodes = {op: list(profile["codecs"]["onebit"][op]) for op in ("encode", "encode_ef")}
    lines = pd.update(profile, measured)
    assert len(lines) == 2 + len(deferred)
    for name, cost in deferred.items():  # a deferred cost depends on the base's decode, which update keeps
        assert profile["codecs"][name]["deferred"] == pytest.approx(cost, rel=1e-12), name
    for op, cost in encodes.items():  # onebit's encodes scaled by the kernel's time over NumPy's (< 1 here)
        r = pd.at(pd.mean(measured["onebit"]["1"], op)) / pd.at(pd.mean(measured["onebit"]["0"], op))
        assert 0 < r < 1 and profile["codecs"]["onebit"][op] == pytest.approx([c * r for c in cost])


def test_a_measurement_has_what_update_reads(tmp_path):
    measured = pd.measure(rounds=1, repeat=1, sizes=(1024, 2048))
    assert [len(measured["onebit"][k]) for k in ("1", "0")] == [1, 1]
    assert set(measured["blocks"]) == {"fp16", "terngrad", "tbq(threshold=0.5)"}
    assert all({"decode", "deferred"} <= set(c) for c in measured["blocks"].values())
    (tmp_path / "m.json").write_text(json.dumps(measured))
    (tmp_path / "base.json").write_text(json.dumps(packaged()))
    pd.main(["update", str(tmp_path / "base.json"), str(tmp_path / "m.json"), str(tmp_path / "out.json")])
    out = json.loads((tmp_path / "out.json").read_text())
    for name in ("onebit", *measured["blocks"]):  # tiny sizes fit no sensible slope: the shape, not the values
        assert len(out["codecs"][name]["deferred"]) == 2, name
