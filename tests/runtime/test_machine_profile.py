"""This machine's calibration, cached (casync.runtime.machine_profile): a hit, a stale key, a corrupt file, where
the cache lives; the calibration itself is replaced by a counter (one short real one at the end)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import casync
from casync.runtime import machine_profile as mp
from casync.runtime.machine_profile import CalibrationCacheWarning, machine_calibration
from casync.sim.costmodel import LinearCost, Profile, RuntimeCosts
from casync.sim.simulator import simulate

CALIBRATED = Profile.default().with_runtime(RuntimeCosts(compute_scale=2.0, task_gap_s=0.0, hop=LinearCost(1e-3, 1e-9),
                                                         plane="direct", op_gap_s=2e-5,
                                                         message_cpu_s=1e-4, copy_cpu={"shm": 1e-10},
                                                         sync_cpu_s=1e-3))


@pytest.fixture
def calls(tmp_path, monkeypatch):
    """The cache in a fresh folder; measure_machine counted, returning CALIBRATED at once."""
    monkeypatch.setenv(mp.CACHE_ENV, str(tmp_path / "cache"))
    seen: list[tuple] = []

    def fake(address=None, cluster=None, progress=False):
        seen.append((address, cluster))
        return CALIBRATED

    monkeypatch.setattr(mp, "measure_machine", fake)
    return seen


def test_a_miss_measures_and_caches_then_a_hit_reads_the_cache(calls):
    said: list[str] = []
    first = machine_calibration(log=said.append)
    assert len(calls) == 1 and first.source == "measured" and first.profile == CALIBRATED
    assert first.path.parent == Path(mp.cache_dir()) and first.path.exists()
    assert "no cached calibration" in said[0] and "measured in" in said[-1]
    second = machine_calibration(log=said.append)
    assert len(calls) == 1 and second.source == "cache" and second.profile == CALIBRATED
    assert (second.made_at, second.seconds) == (first.made_at, pytest.approx(first.seconds))
    assert "from the cache made at" in second.describe() and "calibrated on this machine now" in first.describe()
    assert second.load == first.load and (first.load is None or f"at load average {first.load:.1f}" in
                                          second.describe())
    machine_calibration(refresh=True)  # --recalibrate
    assert len(calls) == 2


@pytest.mark.parametrize("field, value", [("casync", "0.0.1"), ("code", "0" * 64), ("recipe", {"iters": 99}),
                                          ("machine", {"cpu": "another"})])
def test_a_stale_key_is_measured_again_and_replaces_the_entry(calls, field, value):
    made = machine_calibration()
    data = json.loads(made.path.read_text())
    data["key"][field] = value
    made.path.write_text(json.dumps(data))
    said: list[str] = []
    again = machine_calibration(log=said.append)
    assert len(calls) == 2 and again.source == "measured" and again.path == made.path
    assert f"stale ({field} changed)" in said[0]
    assert json.loads(made.path.read_text())["key"] == mp.cache_key()  # replaced: the next run hits
    assert machine_calibration().source == "cache" and len(calls) == 2


def test_a_code_change_changes_the_key(monkeypatch):
    """The hash covers the calibration's own code (and the packaged profile it is fitted against)."""
    before = mp.code_hash()
    assert mp.code_hash() == before
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (b"#" if self.name == "calibrate.py" else b""))
    assert mp.code_hash() != before
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (b" " if self.name == "default_profile.json" else b""))
    assert mp.code_hash() != before


@pytest.mark.parametrize("content", ["{not json", "\xff\xfe", json.dumps([1, 2]), json.dumps({"format": 99}),
                                     "PROFILE_WITHOUT_RUNTIME", "BAD_PROFILE", "NO_SECONDS"])
def test_a_corrupt_cache_file_warns_and_is_measured_again(calls, content):
    made = machine_calibration()
    data = json.loads(made.path.read_text())
    if content == "PROFILE_WITHOUT_RUNTIME":
        data["profile"].pop("runtime")
    elif content == "BAD_PROFILE":
        data["profile"]["merge"] = [-1, 0]
    elif content == "NO_SECONDS":
        data.pop("seconds")
    if content in ("PROFILE_WITHOUT_RUNTIME", "BAD_PROFILE", "NO_SECONDS"):
        content = json.dumps(data)
    made.path.write_bytes(content.encode("latin-1"))
    with pytest.warns(CalibrationCacheWarning, match="unreadable .*measuring again"):
        again = machine_calibration()
    assert len(calls) == 2 and again.source == "measured" and again.profile == CALIBRATED
    assert machine_calibration().source == "cache"  # rewritten whole


def test_an_unreadable_and_unwritable_cache_warns_and_never_crashes(calls):
    path = mp.cache_path(mp.cache_key())
    path.mkdir(parents=True)  # a directory where the file should be: neither read nor replaced
    with pytest.warns(CalibrationCacheWarning) as record:
        made = machine_calibration()
    assert made.source == "measured" and made.profile == CALIBRATED and len(calls) == 1
    messages = [str(w.message) for w in record]
    assert any("unreadable" in m for m in messages) and any("could not cache" in m for m in messages)


def test_the_cache_folder_and_one_file_per_machine_and_place(monkeypatch, tmp_path):
    monkeypatch.setenv(mp.CACHE_ENV, str(tmp_path / "mine"))
    assert mp.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(mp.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mp.cache_dir() == tmp_path / "xdg" / "casync"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert mp.cache_dir() == Path.home() / ".cache" / "casync"
    key = mp.cache_key()
    assert set(key) == {"machine", "where", "casync", "code", "recipe"}
    assert {"cpu", "cores", "host", "ray", "numpy"} <= set(key["machine"])
    cluster = casync.ClusterModel(nodes=2, workers_per_node=1, bandwidth_gbps=1.0)
    elsewhere = mp.cache_key("10.77.0.11:6379", cluster)
    assert mp.cache_path(elsewhere) != mp.cache_path(key)
    assert mp.cache_path(dict(key, code="x", casync="9")) == mp.cache_path(key)  # a stale entry is replaced


def test_a_calibrated_profile_plans_auto_and_predicts():
    """build_plan(..., profile=) takes the calibrated profile: the planner's simulation is the simulator's on it,
    not on the packaged one."""
    cluster = casync.ClusterModel(nodes=1, workers_per_node=2, cores_per_node=2)
    plans = {name: casync.build_plan("resnet50", workers=2, strategy="auto", codec=["none", "onebit"], cluster=cluster,
                                     profile=profile) for name, profile in (("packaged", None), ("calibrated", CALIBRATED))}
    info = plans["calibrated"].options["planner"]
    assert info["simulated_s"] == pytest.approx(simulate(plans["calibrated"], cluster, CALIBRATED).iteration_time)
    assert info["simulated_s"] > 1.2 * plans["packaged"].options["planner"]["simulated_s"]


def test_the_bench_calibration_plans_are_synthetic_tensors_not_a_model_the_bench_measures():
    from casync.plan.models import model_names, model_shapes
    from casync.runtime.calibrate import calibration_tensors

    r = mp.QUICK_RECIPE
    tensors = calibration_tensors(r["tensors"], r["smallest"], r["largest"])
    shapes = sorted(s for _, s in tensors)
    assert len(tensors) == r["tensors"] and all(n.startswith("t") for n, _ in tensors)
    for model in model_names():
        assert sorted(tuple(s) for _, s in model_shapes(model)) != shapes, model


def test_the_short_calibration_runs_every_plan_on_one_set_of_actors(ray_local, monkeypatch):
    """The one real calibration of the suite (a few seconds): the quick recipe on the running Ray, one RayEngine
    re-planned for each plan, and a fitted direct-plane runtime."""
    import casync.runtime.ray_engine as ray_engine

    started = []

    class Counting(ray_engine.RayEngine):
        def __init__(self, *args, **kwargs):
            started.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ray_engine, "RayEngine", Counting)
    profile = mp.measure_machine()
    rt = profile.runtime
    assert len(started) == 1
    assert rt.plane == "direct" and rt.compute_scale >= 1.0 and set(rt.copy_cpu) == {"shm"}
    assert rt.backward_cores > 0  # torch is installed: a backward was measured
    assert rt.samples["gaps"] > 0 and rt.samples["hops"] > 0
    assert profile.codecs == Profile.default().codecs  # fitted on top of the packaged prices
