"""NaN/Inf in one worker's gradient, for every codec, under nonfinite="raise" | "skip" | "propagate"."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import casync
from casync.engines.nonfinite import (BucketLayout, GradientScan, NonFiniteReport, PartitionScans, layouts,
                                      scan_worker)
from casync.errors import NonFiniteGradientError
from casync.primitives.codecs import available_codecs
from casync.primitives.finite import all_finite
from tests.helpers import STRATEGY_CONFIGS, STRATEGY_IDS, applies, make_grads

SHAPES = {"fc.weight": (40, 25), "fc.bias": (25,), "emb": (600,)}
CODECS = {name: name for name in available_codecs()} | {"topk": "topk:ratio=0.05", "randomk": "randomk:ratio=0.05"}
BAD = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}
WORKERS = 3


def poisoned(seed: int, value: float, worker: int = 1, tensor: str = "fc.weight", where=(3, 4)):
    grads = make_grads(SHAPES, WORKERS, seed=seed)
    grads[worker][tensor][where] = value
    return grads


def state_equal(a: dict, b: dict) -> bool:
    return a["step"] == b["step"] and a["residuals"].keys() == b["residuals"].keys() and all(
        np.array_equal(a["residuals"][k], b["residuals"][k]) for k in a["residuals"])


def assert_same_bits(x: np.ndarray, y: np.ndarray) -> None:
    """Bit-identical float32 arrays, NaN payloads included."""
    assert x.shape == y.shape
    np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32))


def test_option_is_validated_and_stored():
    plan = casync.build_plan(SHAPES, workers=2, nonfinite="skip")
    assert plan.nonfinite == "skip" and plan.options["nonfinite"] == "skip"
    assert casync.build_plan(SHAPES, workers=2).nonfinite == "raise"
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        casync.build_plan(SHAPES, workers=2, nonfinite="ignore")
    with pytest.raises(TypeError, match="nonfinite"):
        casync.build_plan(SHAPES, workers=2, nonfinite=True)
    auto = casync.build_plan("tiny", workers=2, strategy="auto", codec="auto", nonfinite="propagate")
    assert auto.nonfinite == "propagate"


def test_finiteness_check_and_scan_name_tensors():
    x = np.ones(10_000, np.float32)
    assert all_finite(x) and all_finite(x[:0])
    assert all_finite(np.full(10_000, 3e38, np.float32))  # the sum overflows, the values are finite
    x[77] = np.nan
    assert not all_finite(x)
    plan = casync.build_plan(SHAPES, workers=2, bucket_bytes=1 << 20)  # all three fused in one bucket
    grads = make_grads(SHAPES, 2)
    grads[0]["fc.bias"][[1, 2]] = [np.inf, -np.inf]
    grads[0]["emb"][5] = np.nan
    from casync.engines.inputs import flatten_worker_grads

    flats, _ = flatten_worker_grads(plan, grads)
    reports, parts = scan_worker(layouts(plan), 0, flats[0])
    assert {(r.tensor, r.nan, r.inf) for r in reports} == {("fc.bias", 0, 2), ("emb", 1, 0)}
    assert parts and all(b == plan.buckets[0].name for b, _ in parts)
    assert scan_worker(layouts(plan), 1, flats[1]) == ([], set())


def test_a_partition_two_compute_threads_read_is_scanned_once_and_flagged_before_either_reads_it():
    """An executor's second compute thread that reads a partition while the first is scanning it waits for
    that scan, and sees the partition flagged; the scan runs once and its reports count each value once."""
    started, release, calls = threading.Event(), threading.Event(), []

    class SlowScan(GradientScan):
        def check(self, values):
            calls.append(values.size)
            started.set()
            release.wait(5)
            return GradientScan.check(values)

    flagged: set = set()
    scans = PartitionScans(SlowScan(3, {"b": BucketLayout("b", ("t", "u"), (6, 8), (4, 8))}), flagged)
    scans.expect("b", 2)
    values = np.array([1, np.nan, 2, np.inf], np.float32)
    saw = {}

    def read(name):
        scans.before_read("b", 0, 0, values)
        saw[name] = ("b", 0) in flagged

    first = threading.Thread(target=read, args=("first",))
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=read, args=("second",))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first thread's scan, not reading unflagged data
    release.set()
    first.join(5)
    second.join(5)
    assert saw == {"first": True, "second": True} and calls == [4]
    scans.before_read("b", 1, 4, np.ones(4, np.float32))  # finite: not flagged
    assert flagged == {("b", 0)} and calls == [4, 4]
    assert scans.reports() == [NonFiniteReport(3, "t", 1, 1)]


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("codec", [c for c in sorted(CODECS) if applies(c, "ring", {})])
def test_raise_names_worker_tensor_and_count_and_leaves_engine_untouched(codec, bad):
    plan = casync.build_plan(SHAPES, workers=WORKERS, strategy="ring", codec=CODECS[codec])
    engine, reference = casync.LocalEngine(plan), casync.LocalEngine(plan)
    for engine_ in (engine, reference):
        engine_.sync(make_grads(SHAPES, WORKERS, seed=0))
    before = engine.state_dict()
    with pytest.raises(NonFiniteGradientError) as info:
        engine.sync(poisoned(1, BAD[bad]))
    message = str(info.value)
    assert "worker 1" in message and "'fc.weight'" in message
    assert ("1 NaN" if bad == "nan" else "1 Inf") in message
    [report] = info.value.reports
    assert (report.worker, report.tensor, report.nan + report.inf) == (1, "fc.weight", 1)
    assert isinstance(info.value, casync.SyncError) and isinstance(info.value, ValueError)
    assert state_equal(engine.state_dict(), before)
    clean = make_grads(SHAPES, WORKERS, seed=2)  # still usable: the same as if the bad call never happened
    out, expected = engine.sync(clean), reference.sync(clean)
    for w in range(WORKERS):
        for name in SHAPES:
            assert_same_bits(out[w][name], expected[w][name])


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("codec", sorted(CODECS))
def test_skip_zeroes_every_worker_and_keeps_residuals(codec, bad):
    plan = casync.build_plan(SHAPES, workers=WORKERS, strategy="ps", servers=1, codec=CODECS[codec],
                             nonfinite="skip")
    engine = casync.LocalEngine(plan)
    engine.sync(make_grads(SHAPES, WORKERS, seed=0))
    before = engine.state_dict()
    out = engine.sync(poisoned(1, BAD[bad]))
    assert out.skipped and [(r.worker, r.tensor) for r in out.nonfinite] == [(1, "fc.weight")]
    for w in range(WORKERS):
        for name, shape in SHAPES.items():
            assert out[w][name].shape == shape and not out[w][name].any()
    after = engine.state_dict()
    assert after["step"] == before["step"] + 1  # the step counts; its residual updates do not
    assert state_equal(after, dict(before, step=before["step"] + 1))
    follow = engine.sync(make_grads(SHAPES, WORKERS, seed=2))
    assert not follow.skipped and not follow.nonfinite
    assert all(np.isfinite(follow[w][n]).all() for w in range(WORKERS) for n in SHAPES)


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("strategy,extra,codec", [
    pytest.param(strategy, extra, codec, id=f"{sid}-{codec}")
    for (strategy, extra), sid in zip(STRATEGY_CONFIGS, STRATEGY_IDS) for codec in sorted(CODECS)
    if applies(codec, strategy, extra)])
def test_propagate_reaches_every_worker_at_that_position_only(strategy, extra, codec, bad):
    """The bad value lands where it was, bit-identical on every worker; the codec's scale is not poisoned
    (every other entry stays finite and bounded); residuals stay finite; the next clean step is clean."""
    plan = casync.build_plan(SHAPES, workers=WORKERS, strategy=strategy, codec=CODECS[codec],
                             nonfinite="propagate", **extra)
    engine = casync.LocalEngine(plan)
    engine.sync(make_grads(SHAPES, WORKERS, seed=0))  # some error-feedback state first
    grads = poisoned(1, BAD[bad])
    out = engine.sync(grads)
    assert not out.skipped and [(r.worker, r.tensor) for r in out.nonfinite] == [(1, "fc.weight")]
    bound = 4 * WORKERS * max(np.abs(g[n][np.isfinite(g[n])]).max() for g in grads for n in SHAPES)
    for w in range(WORKERS):
        for name in SHAPES:
            assert_same_bits(out[w][name], out[0][name])
    result = out[0]["fc.weight"]
    if bad == "nan":
        assert np.isnan(result[3, 4])
    else:
        assert result[3, 4] == BAD[bad]  # Inf stays Inf with its sign
    others = np.delete(result.ravel(), 3 * 25 + 4)
    assert np.isfinite(others).all() and np.abs(others).max() <= bound
    for name in ("fc.bias", "emb"):
        assert np.isfinite(out[0][name]).all() and np.abs(out[0][name]).max() <= bound
    assert all(np.isfinite(r).all() for r in engine.state_dict()["residuals"].values())
    follow = engine.sync(make_grads(SHAPES, WORKERS, seed=2))
    assert all(np.isfinite(follow[w][n]).all() for w in range(WORKERS) for n in SHAPES)


@pytest.mark.parametrize("codec", [c for c in sorted(CODECS) if applies(c, "allgather", {})])
def test_propagate_single_encode_equals_a_zero_in_its_place(codec):
    """All-gather encodes each gradient once: apart from the bad position, the result is exactly what a zero
    in its place gives (the codec never saw the Inf)."""
    plan = casync.build_plan(SHAPES, workers=WORKERS, strategy="allgather", codec=CODECS[codec],
                             nonfinite="propagate")
    out = casync.LocalEngine(plan).sync(poisoned(0, np.inf))
    zero = casync.LocalEngine(plan).sync(poisoned(0, 0.0))
    got, expected = out[2]["fc.weight"].copy(), zero[2]["fc.weight"].copy()
    assert got[3, 4] == np.inf
    got[3, 4] = expected[3, 4] = 0
    assert_same_bits(got, expected)


def test_two_workers_opposite_infinities_give_nan_everywhere_alike():
    plan = casync.build_plan(SHAPES, workers=WORKERS, strategy="ring", codec="onebit", nonfinite="propagate")
    grads = poisoned(0, np.inf)
    grads[2]["fc.weight"][3, 4] = -np.inf
    out = casync.LocalEngine(plan).sync(grads)
    assert all(np.isnan(out[w]["fc.weight"][3, 4]) for w in range(WORKERS))
    assert np.isfinite(np.delete(out[0]["fc.weight"].ravel(), 3 * 25 + 4)).all()


def test_nonfinite_residuals_are_refused_on_load():
    plan = casync.build_plan(SHAPES, workers=2, codec="onebit")
    engine = casync.LocalEngine(plan)
    engine.sync(make_grads(SHAPES, 2))
    state = engine.state_dict()
    key = next(iter(state["residuals"]))
    state["residuals"][key][0] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        engine.load_state_dict(state)


# -- the Ray engine: same outcomes, driver-side and actor-side detection --------------------------------------
RAY_CONFIGS = [("ring", "qsgd", {}), ("ps", "terngrad", {"servers": 2})]


def _remote_flats(ray, plan, grads):
    """Gradients as ObjectRefs the driver never reads (as an actor computing them would hand over)."""
    from casync.engines.inputs import flatten_worker_grads

    flats, _ = flatten_worker_grads(plan, grads)
    return [ray.put(f) for f in flats]


def _by_tensor(plan, flat_out, worker):
    bucket, member = plan.locate("fc.weight")
    return flat_out[worker][bucket.name][member.offset:member.stop].reshape(SHAPES["fc.weight"])


@pytest.mark.parametrize("strategy,codec,extra", RAY_CONFIGS, ids=[c[0] for c in RAY_CONFIGS])
def test_ray_propagate_is_bit_identical_to_local(ray_local, strategy, codec, extra):
    """Driver-scanned (sync) and actor-scanned (run_flat of ObjectRefs) steps alike."""
    plan = casync.build_plan(SHAPES, workers=WORKERS, strategy=strategy, codec=codec, nonfinite="propagate",
                             **extra)
    local = casync.LocalEngine(plan)
    with casync.RayEngine(plan, timeout_s=60) as engine:
        for grads in (make_grads(SHAPES, WORKERS, seed=0), poisoned(1, np.nan), poisoned(2, -np.inf, worker=2)):
            expected, got = local.sync(grads), engine.sync(grads)
            assert [str(r) for r in got.nonfinite] == [str(r) for r in expected.nonfinite]
            for w in range(WORKERS):
                for name in SHAPES:
                    assert_same_bits(got[w][name], expected[w][name])
        bad = poisoned(3, np.inf, worker=0)
        expected, got = local.sync(bad), engine.run_flat(_remote_flats(ray_local, plan, bad))
        assert [str(r) for r in got.nonfinite] == ["worker 0, tensor 'fc.weight': 0 NaN, 1 Inf"]
        for w in range(WORKERS):
            assert_same_bits(_by_tensor(plan, got, w), expected[w]["fc.weight"])
        assert state_equal(engine.state_dict(), local.state_dict())


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_ray_raise_and_skip_leave_state_and_engine_usable(ray_local, mode):
    """The driver's scan (sync) decides before submitting; an actor's scan (ObjectRef gradients) after the
    step ran, which is then rolled back on every actor, dedicated server included."""
    plan = casync.build_plan(SHAPES, workers=WORKERS, strategy="ps", servers=1, codec="onebit", nonfinite=mode)
    reference = casync.LocalEngine(plan)
    with casync.RayEngine(plan, timeout_s=60) as engine:
        first = make_grads(SHAPES, WORKERS, seed=0)
        reference.sync(first)
        engine.sync(first)
        bad = poisoned(1, np.inf)
        for label, call in (("driver", lambda: engine.sync(bad)),
                            ("actor", lambda: engine.run_flat(_remote_flats(ray_local, plan, bad)))):
            before = engine.state_dict()
            if mode == "raise":
                with pytest.raises(NonFiniteGradientError, match="worker 1, tensor 'fc.weight': 0 NaN, 1 Inf"):
                    call()
                assert state_equal(engine.state_dict(), before), label
            else:
                out = call()
                assert out.skipped and all(not v.any() for worker in out for v in worker.values()), label
                assert state_equal(engine.state_dict(), dict(before, step=before["step"] + 1)), label
                reference.load_state_dict(engine.state_dict())
            clean = make_grads(SHAPES, WORKERS, seed=len(label))
            got, expected = engine.sync(clean), reference.sync(clean)
            for w in range(WORKERS):
                for name in SHAPES:
                    assert_same_bits(got[w][name], expected[w][name])
            assert state_equal(engine.state_dict(), reference.state_dict()), label
