"""`casync bench` calibrates the machine before it plans ``auto`` and predicts, unless told not to; the report says
which profile it used.  The calibration is a counter here and the grid is never run (run_bench is replaced), so
nothing calibrates or starts Ray."""
from __future__ import annotations

import json

import pytest

from casync.bench.grid import Grid
from casync.bench.report import render_markdown, text_summary
from casync.bench.runner import BenchResult, run_bench
from casync.bench.setup import local_setup
from casync.cli import main
from casync.runtime import machine_profile as mp
from casync.sim.costmodel import LinearCost, Profile, RuntimeCosts

CALIBRATED = Profile.default().with_runtime(RuntimeCosts(compute_scale=2.0, task_gap_s=0.0, hop=LinearCost(1e-3, 0.0),
                                                         plane="direct"))
TINY = ["--models", "tiny", "--workers", "2", "--strategies", "ring,auto", "--codecs", "onebit", "--baselines", "none",
        "--no-sim", "--no-progress"]


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """Run `casync bench ARGS` with the calibration counted and the grid not run: returns (exit code, the number of
    calibrations, what run_bench was given)."""
    import casync.bench.runner as runner

    monkeypatch.setenv(mp.CACHE_ENV, str(tmp_path / "cache"))
    calls: list[int] = []
    monkeypatch.setattr(mp, "measure_machine", lambda address=None, cluster=None, progress=False: calls.append(1)
                        or CALIBRATED)
    given: dict = {}

    def fake_run_bench(grid, setup, **kw):
        given.update(kw)
        return BenchResult(setup=setup, grid=grid, rows=[], sim_rows=[], machine={}, command="", seconds=0.0,
                           iters=1, warmup=0)

    monkeypatch.setattr(runner, "run_bench", fake_run_bench)

    def run(*args: str) -> tuple[int, int, dict]:
        given.clear()
        return main(["bench", *TINY, *args]), len(calls), dict(given)

    return run


def test_bench_calibrates_by_default_then_reads_the_cache(bench, capsys):
    code, calls, given = bench("--hooks", "none")
    assert code == 0 and calls == 1
    assert given["profile"] == CALIBRATED and given["calibration"].source == "measured"
    assert "calibration: no cached calibration" in capsys.readouterr().err
    code, calls, given = bench("--hooks", "none")
    assert code == 0 and calls == 1 and given["calibration"].source == "cache"
    assert "from the cache made at" in capsys.readouterr().err
    code, calls, given = bench("--hooks", "none", "--recalibrate")
    assert code == 0 and calls == 2 and given["calibration"].source == "measured"


def test_no_calibrate_and_a_given_profile_skip_the_calibration(bench, tmp_path):
    code, calls, given = bench("--hooks", "none", "--no-calibrate")
    assert code == 0 and calls == 0 and given["profile"] is None and given["calibration"] is None
    path = CALIBRATED.save(tmp_path / "mine.json")
    for extra in ((), ("--no-calibrate",), ("--recalibrate",)):  # --profile wins over both
        code, calls, given = bench("--hooks", "none", "--profile", str(path), *extra)
        assert code == 0 and calls == 0 and given["profile"] == CALIBRATED and given["calibration"] is None
        assert given["profile_source"] == str(path)


def test_a_run_that_predicts_nothing_measured_is_not_calibrated(bench):
    """Baselines alone have no prediction; the simulated grid uses no machine's runtime."""
    code, calls, _ = bench("--strategies", "", "--hooks", "none", "--baselines", "gloo-bucket")
    assert code == 0 and calls == 0
    code, calls, _ = bench("--strategies", "", "--hooks", "ring/onebit", "--baselines", "ddp")  # hook rows: predicted
    assert code == 0 and calls == 1


def test_no_calibrate_and_recalibrate_are_refused_together(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", *TINY, "--no-calibrate", "--recalibrate"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def _report(result: BenchResult) -> str:
    result.grid = Grid(models=("tiny",), workers=(2,), strategies=("ring",), codecs=("onebit",), baselines=(), hooks=())
    return render_markdown(result, [])


def test_the_report_says_which_profile_predicted_the_rows(tmp_path):
    """The header (and the JSON, and the terminal summary) name the profile: packaged, calibrated now in N s,
    from the cache made at a time, or a file (run_bench on an empty grid: nothing runs)."""
    grid = Grid(models=(), workers=(), strategies=("ring",), codecs=("onebit",), baselines=(), hooks=(),
                sim_workers=(8,), sim_bandwidths_gbps=(1.0,), sim_models=("tiny",))
    packaged = run_bench(grid, local_setup(), simulate=False, progress=False)
    assert packaged.to_json()["calibration"] == {"source": "packaged"}
    assert "not calibrated on this machine" in _report(packaged)
    now = mp.Calibration(CALIBRATED, "measured", 12.3, "2026-12-01T10:00:00Z", tmp_path / "c.json")
    measured = run_bench(grid, local_setup(), simulate=False, progress=False, profile=CALIBRATED, calibration=now)
    record = json.loads(json.dumps(measured.to_json(), default=str))["calibration"]
    assert record["source"] == "measured" and record["seconds"] == 12.3 and record["runtime"]["compute_scale"] == 2.0
    assert "calibrated on this machine now, in 12 s" in _report(measured)
    assert "calibrated on this machine now, in 12 s" in text_summary(measured)
    cached = mp.Calibration(CALIBRATED, "cache", 12.3, "2026-12-01T10:00:00Z", tmp_path / "c.json", load=1.5)
    result = run_bench(grid, local_setup(), simulate=False, progress=False, profile=CALIBRATED, calibration=cached)
    text = _report(result)
    assert "from the cache made at 2026-12-01T10:00:00Z at load average 1.5" in text and str(tmp_path / "c.json") in text
    assert result.to_json()["calibration"]["made_at"] == "2026-12-01T10:00:00Z"
    given = run_bench(grid, local_setup(), simulate=False, progress=False, profile=CALIBRATED, profile_source="p.json")
    assert given.to_json()["calibration"] == {"source": "file", "path": "p.json"}


def test_an_auto_hook_row_plans_with_the_profile_its_prediction_uses(monkeypatch):
    """The ranks of an ``auto`` hook row get the bench's profile (calibrated or --profile) for its planner, as a
    file beside their result; a fixed row's plan does not depend on one."""
    import casync.bench.baselines as baselines

    assert baselines.auto_profile("ddp-casync:auto:onebit", CALIBRATED) == {"profile": CALIBRATED}
    for variant, profile in (("ddp-casync:ring:onebit", CALIBRATED), ("ddp", CALIBRATED),
                             ("ddp-casync:auto:onebit", None)):
        assert baselines.auto_profile(variant, profile) == {}
    seen: list[Profile | None] = []

    def fake_ranks(launcher, workers, code, args, **kw):
        seen.append(Profile.load(args[args.index("--profile") + 1]) if "--profile" in args else None)
        with open(args[args.index("--result") + 1], "w") as f:
            f.write("{}")

    monkeypatch.setattr(baselines, "run_ranks", fake_ranks)
    cluster = local_setup().cluster_model(2)
    for profile in (CALIBRATED, None):
        assert baselines.run_baselines(local_setup().launcher(), "tiny", 2, ["ddp-casync:auto:onebit"],
                                       cluster=cluster, profile=profile) == {}
    assert seen == [CALIBRATED, None]
