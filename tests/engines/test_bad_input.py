"""Bad input at every public entry point: a typed error that names what was wrong, raised quickly, and an
engine that still works (same results as one that never saw the bad call) afterwards."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import casync
from casync import cli
from casync.engines.inputs import flatten_worker_grads
from casync.errors import PlanFormatError
from casync.sim.costmodel import ClusterModel, Profile
from casync.primitives.codecs import available_codecs
from tests.helpers import applies, make_grads

pytestmark = pytest.mark.timeout(120)  # "bounded time": a hang fails the test instead of stalling the suite

SHAPES = {"a": (4, 3), "b": (5,), "s": ()}


# -- build_plan ------------------------------------------------------------------------------------------------
BUILD_CASES = [
    # (label, kwargs, exception, what the message must say)
    ("tensors None", dict(tensors=None), TypeError, "tensors must be"),
    ("tensors int", dict(tensors=5), TypeError, "got int"),
    ("unknown model", dict(tensors="ghost"), ValueError, "unknown model 'ghost'"),
    ("empty mapping", dict(tensors={}), ValueError, "no tensors"),
    ("empty module", dict(tensors=torch.nn.Module()), ValueError, "no tensors"),
    ("frozen module", dict(tensors=torch.nn.Linear(2, 2).requires_grad_(False)), ValueError, "no tensors"),
    ("negative dim", dict(tensors={"a": (-1,)}), ValueError, "tensor 'a': negative dimension"),
    ("string shape", dict(tensors={"a": "x"}), TypeError, "tensor 'a': shape"),
    ("float dim", dict(tensors={"a": (2.5,)}), TypeError, "tensor 'a': shape"),
    ("array as shape", dict(tensors={"a": np.zeros(3, int)}), TypeError, "tensor 'a': expected a shape, got a ndarray"),
    ("tensor as shape", dict(tensors={"a": torch.zeros(3)}), TypeError, "tensor 'a': expected a shape, got a Tensor"),
    ("empty name", dict(tensors={"": (3,)}), TypeError, "non-empty strings"),
    ("int name", dict(tensors={1: (3,)}), TypeError, "got 1"),
    ("duplicate name", dict(tensors=[("a", (3,)), ("a", (2,))]), ValueError, "tensor 'a' appears twice"),
    ("bad pair", dict(tensors=[("a", (3,), 1)]), TypeError, r"tensors\[0\]"),
    ("workers 0", dict(workers=0), ValueError, "workers must be >= 1, got 0"),
    ("workers -1", dict(workers=-1), ValueError, "workers must be >= 1"),
    ("workers str", dict(workers="4"), TypeError, "workers must be an int, got '4'"),
    ("workers float", dict(workers=4.0), TypeError, "workers must be an int"),
    ("workers bool", dict(workers=True), TypeError, "workers must be an int"),
    ("unknown strategy", dict(strategy="tree"), ValueError, "unknown strategy 'tree'"),
    ("strategy None", dict(strategy=None), TypeError, "strategy must be a string"),
    ("unknown codec", dict(codec="zstd"), ValueError, "unknown codec 'zstd'"),
    ("codec param range", dict(codec="topk:ratio=2"), ValueError, "'ratio' must be a float in"),
    ("codec param name", dict(codec="topk:k=2"), ValueError, "no parameter 'k'"),
    ("codec type", dict(codec=5), TypeError, "codec spec"),
    ("codec tuple", dict(codec=("topk", 5)), TypeError, "codec spec tuple"),
    ("servers 0", dict(strategy="ps", servers=0), ValueError, "servers must be >= 1"),
    ("servers with ring", dict(strategy="ring", servers=2), ValueError, r"only applies to a strategy with servers \(ps\)"),
    ("partitions 0", dict(partitions=0), ValueError, "partitions must be >= 1"),
    ("partitions str", dict(partitions="3"), TypeError, "partitions must be an int"),
    ("partitions over max", dict(partitions=2**17), ValueError, "supported maximum"),
    ("huge partitions", dict(tensors="resnet50", partitions=65536), ValueError, "would have about 8,519,680 ops"),
    ("huge cluster", dict(tensors="tiny", workers=5000, strategy="allgather"), ValueError, "compact=True"),
    ("two_way str", dict(two_way="yes"), TypeError, "two_way must be True or False"),
    ("one-way ring", dict(strategy="ring", two_way=False), ValueError, r"two_way=False only applies to .* not 'ring'"),
    ("one-way allgather", dict(strategy="allgather", two_way=False), ValueError, "two_way=False only applies"),
    ("error_feedback int", dict(error_feedback=1), TypeError, "error_feedback must be 'auto', True or False"),
    ("op max", dict(op="max"), ValueError, "op must be 'mean' or 'sum'"),
    ("bucket_bytes -1", dict(bucket_bytes=-1), ValueError, "bucket_bytes must be >= 0"),
    ("bucket_bytes float", dict(bucket_bytes=1.5), TypeError, "bucket_bytes must be an int"),
    ("seed -1", dict(seed=-1), ValueError, "seed must be >= 0"),
    ("nonfinite mode", dict(nonfinite="ignore"), ValueError, "nonfinite must be one of"),
    ("auto: cluster type", dict(tensors="tiny", strategy="auto", cluster="big"), TypeError, "ClusterModel"),
    ("auto: profile type", dict(tensors="tiny", strategy="auto", profile="p.json"), TypeError, "Profile"),
    ("auto: unknown ready", dict(tensors="tiny", strategy="auto", ready_times={"ghost": 1.0}), ValueError, "ghost"),
    ("auto: nan ready", dict(tensors="tiny", strategy="auto", ready_times={"fc1.weight": float("nan")}),
     ValueError, r"ready_times\['fc1.weight'\]"),
    ("auto: servers", dict(tensors="tiny", strategy="auto", servers=2), ValueError, "automatic planning"),
    ("auto: bad candidate", dict(tensors="tiny", codec=["onebit", "zstd"]), ValueError, "unknown codec 'zstd'"),
]


@pytest.mark.parametrize("label,kwargs,exc,needle", BUILD_CASES, ids=[c[0] for c in BUILD_CASES])
def test_build_plan_rejects(label, kwargs, exc, needle):
    kwargs = {"tensors": SHAPES, **kwargs}
    with pytest.raises(exc, match=needle):
        casync.build_plan(kwargs.pop("tensors"), **kwargs)


def test_numpy_integers_and_zero_size_tensors_are_fine():
    plan = casync.build_plan({"z": (0,), "z2": (0, 3), "a": (np.int64(5),)}, workers=np.int64(3),
                             partitions=np.int32(2), seed=np.uint8(1))
    assert plan.workers == 3 and isinstance(plan.workers, int)
    assert json.loads(json.dumps(plan.to_dict()))["workers"] == 3


ZERO_SHAPES = {"z": (0,), "z2": (0, 3), "a": (5,)}


@pytest.mark.parametrize("bucket_bytes", [0, None], ids=["own-buckets", "fused"])
@pytest.mark.parametrize("codec,strategy,extra", [
    pytest.param(codec, strategy, extra, id=f"{codec}-{sid}") for codec in available_codecs()
    for (strategy, extra), sid in zip([("ring", {}), ("allgather", {}), ("ps", {}), ("ps", {"servers": 2})],
                                      ["ring", "allgather", "ps", "ps-servers"]) if applies(codec, strategy, extra)])
def test_zero_size_tensors_sync_on_every_codec(codec, strategy, extra, bucket_bytes):
    plan = casync.build_plan(ZERO_SHAPES, workers=3, strategy=strategy, codec=codec, bucket_bytes=bucket_bytes,
                             **extra)
    engine = casync.LocalEngine(plan)
    for step in range(2):
        grads = make_grads(ZERO_SHAPES, 3, seed=step)
        out = engine.sync(grads)
        for w in range(3):
            for name, shape in ZERO_SHAPES.items():
                assert out[w][name].shape == shape
                np.testing.assert_array_equal(out[w][name], out[0][name])
        if codec == "none":
            np.testing.assert_allclose(out[0]["a"], np.mean([g["a"] for g in grads], axis=0), rtol=1e-6)


_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**7), st.floats(allow_nan=True), st.text(max_size=6),
                  st.lists(st.integers(-2, 4), max_size=3), st.sampled_from(["ring", "ps", "allgather", "auto"]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=_JUNK, strategy=_JUNK, codec=st.one_of(_JUNK, st.sampled_from(available_codecs())),
       partitions=_JUNK, bucket_bytes=_JUNK, servers=_JUNK, seed=_JUNK)
def test_build_plan_any_options_typed_error_or_plan(workers, strategy, codec, partitions, bucket_bytes, servers, seed):
    """Whatever the options, build_plan returns a plan or raises TypeError/ValueError (never anything else)."""
    try:
        plan = casync.build_plan("tiny", workers=workers, strategy=strategy, codec=codec, partitions=partitions,
                                 bucket_bytes=bucket_bytes, servers=servers, seed=seed)
    except (TypeError, ValueError) as exc:
        assert str(exc)
        return
    assert isinstance(plan, casync.SyncPlan) and plan.graph.number_of_nodes() > 0


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.one_of(st.text(max_size=4), st.integers()),
                       st.one_of(st.lists(st.integers(-2, 6), max_size=3), st.integers(-2, 6), st.text(max_size=3),
                                 st.none(), st.floats()), max_size=4))
def test_tensor_specs_typed_error_or_plan(tensors):
    try:
        plan = casync.build_plan(tensors, workers=2, codec="onebit")
    except (TypeError, ValueError) as exc:
        assert str(exc)
        return
    out = casync.LocalEngine(plan).sync(make_grads({t.name: t.shape for t in plan.tensors}, 2))
    assert {t.name for t in plan.tensors} == set(out[0])


# -- engines: sync ------------------------------------------------------------------------------------------------
def _set(worker, name, value):
    """A mutation: worker's ``name`` becomes ``value``; returns the grads to pass."""
    return lambda g: (g[worker].__setitem__(name, value), g)[1]


SYNC_CASES = [
    ("grads None", lambda g: None, TypeError, "grads must be a list"),
    ("grads dict", lambda g: {"a": 1}, TypeError, "grads must be a list"),
    ("grads generator", lambda g: (x for x in g), TypeError, "grads must be a list"),
    ("too few workers", lambda g: g[:1], ValueError, "grads has 1 entries but the plan has 2 workers"),
    ("too many workers", lambda g: g + g[:1], ValueError, "grads has 3 entries"),
    ("worker not mapping", lambda g: [g[0], [1, 2]], TypeError, "worker 1: expected a mapping"),
    ("missing tensor", lambda g: (g[1].pop("a"), g)[1], ValueError, r"worker 1: missing gradient for tensor\(s\) \['a'\]"),
    ("unknown tensor", _set(1, "ghost", np.ones(3, np.float32)), ValueError, r"worker 1: unexpected tensor\(s\) \['ghost'\]"),
    ("wrong shape", _set(1, "a", np.ones((3, 4), np.float32)), ValueError,
     r"worker 1, tensor 'a': expected shape \(4, 3\), got \(3, 4\)"),
    ("zero-size instead", _set(0, "b", np.ones(0, np.float32)), ValueError, "worker 0, tensor 'b': expected shape"),
    ("int dtype", _set(1, "a", np.ones((4, 3), int)), TypeError, "worker 1, tensor 'a': .*floating-point.*int64"),
    ("bool dtype", _set(1, "a", np.ones((4, 3), bool)), TypeError, "tensor 'a'.*bool"),
    ("complex dtype", _set(1, "a", np.ones((4, 3), complex)), TypeError, "tensor 'a'.*complex"),
    ("object dtype", _set(1, "a", np.ones((4, 3), object)), TypeError, "tensor 'a'.*object"),
    ("list value", _set(1, "b", [1.0] * 5), TypeError, "worker 1, tensor 'b': expected a numpy.ndarray or torch.Tensor"),
    ("None value", _set(0, "s", None), TypeError, "worker 0, tensor 's'"),
    ("masked array", _set(1, "b", np.ma.masked_array(np.ones(5, np.float32), mask=True)), TypeError, "masked"),
    ("torch int", _set(1, "a", torch.ones(4, 3, dtype=torch.int64)), TypeError, "tensor 'a'.*torch.int64"),
    ("torch complex", _set(1, "a", torch.ones(4, 3, dtype=torch.complex64)), TypeError, "tensor 'a'"),
    ("torch meta", _set(1, "a", torch.ones(4, 3, device="meta")), TypeError, "tensor 'a'.*meta"),
    ("torch sparse", _set(1, "a", torch.ones(4, 3).to_sparse()), TypeError, "tensor 'a'.*sparse"),
    ("torch negative view", _set(1, "a", torch._neg_view(torch.ones(4, 3))), TypeError,
     "worker 1, tensor 'a': cannot read this tensor as float32 on the CPU"),
    ("torch wrong shape", _set(0, "a", torch.ones(12)), ValueError, "worker 0, tensor 'a': expected shape"),
]
GOOD_VARIANTS = {  # accepted and converted to float32: the same result as float32 NumPy input
    "float64": lambda a: a.astype(np.float64),
    "float16": lambda a: a.astype(np.float16),
    "non-contiguous": lambda a: np.asfortranarray(a),
    "torch": lambda a: torch.from_numpy(a.copy()),
    "torch requires_grad": lambda a: torch.from_numpy(a.copy()).requires_grad_(True),
    "torch non-contiguous": lambda a: torch.from_numpy(a.T.copy()).t(),
    "torch bfloat16": lambda a: torch.from_numpy(a.copy()).to(torch.bfloat16),
}


def _clean_grads(seed):
    grads = make_grads(SHAPES, 2, seed=seed)
    for g in grads:  # values exact in float16 and bfloat16, so converted inputs give the same float32 sums
        for k in g:
            g[k] = np.round(g[k] * 4).astype(np.float32) / 4
    return grads


def _check_engine(engine, reference):
    """Run the bad cases on ``engine``; after each, a good sync matches ``reference`` (which saw only good ones)."""
    seen = 0
    for label, mutate, exc, needle in SYNC_CASES:
        grads = _clean_grads(seen)
        with pytest.raises(exc, match=needle):
            engine.sync(mutate(grads))
        good = _clean_grads(100 + seen)
        got, expected = engine.sync(good), reference.sync(good)
        for name in SHAPES:
            np.testing.assert_array_equal(got[1][name], expected[1][name], err_msg=f"after {label}")
        seen += 1
    for label, convert in [*GOOD_VARIANTS.items(), ("python float", None)]:
        grads = _clean_grads(200 + seen)
        if convert is None:
            grads[1]["s"] = float(grads[1]["s"])
        else:
            grads[1]["a"] = convert(grads[1]["a"])
        got, expected = engine.sync(grads), reference.sync(_clean_grads(200 + seen))
        for name in SHAPES:
            value = got[1][name]
            value = value.detach().numpy() if isinstance(value, torch.Tensor) else value
            np.testing.assert_array_equal(value, expected[1][name], err_msg=label)
        seen += 1
    assert engine.step == reference.step


@pytest.mark.parametrize("codec", ["onebit", "topk:ratio=0.3"])
def test_local_engine_rejects_bad_sync_and_stays_usable(codec):
    plan = casync.build_plan(SHAPES, workers=2, codec=codec)
    _check_engine(casync.LocalEngine(plan), casync.LocalEngine(plan))


def test_ray_engine_rejects_bad_sync_and_stays_usable(ray_local):
    plan = casync.build_plan(SHAPES, workers=2, strategy="ps", servers=1, codec="onebit")
    with casync.RayEngine(plan, timeout_s=60) as engine:
        _check_engine(engine, casync.LocalEngine(plan))
        flats, _ = flatten_worker_grads(plan, _clean_grads(0))
        bucket = plan.buckets[0].name
        for bad, needle in ((flats[:1], "flats has 1 entries"),
                            ([flats[0], {bucket: flats[1][bucket][:-1]}], f"worker 1, bucket '{bucket}'"),
                            ([flats[0], {bucket: flats[1][bucket].astype(np.float64)}], "float32")):
            with pytest.raises(ValueError, match=needle):
                engine.run_flat(bad)
        assert len(engine.run_flat(flats)) == 2
    zero = casync.build_plan(ZERO_SHAPES, workers=2, codec="topk:ratio=0.5", bucket_bytes=0)
    with casync.RayEngine(zero, timeout_s=60) as engine:
        grads = make_grads(ZERO_SHAPES, 2)
        got, expected = engine.sync(grads), casync.LocalEngine(zero).sync(grads)
        for name in ZERO_SHAPES:
            np.testing.assert_array_equal(got[1][name], expected[1][name])


RAY_ARGS = [
    (dict(plan="plan"), TypeError, "needs a SyncPlan"),
    (dict(timeout_s=float("inf")), ValueError, "timeout_s must be a finite positive number"),
    (dict(timeout_s=float("nan")), ValueError, "timeout_s"),
    (dict(timeout_s=True), ValueError, "timeout_s"),
    (dict(timeout_s="5"), ValueError, "timeout_s"),
    (dict(timeout_s=0), ValueError, "timeout_s"),
    (dict(placement="ring"), ValueError, "placement must be 'spread' or 'pack'"),
    (dict(num_cpus_per_actor=-1), ValueError, "num_cpus_per_actor"),  # Ray's raylet crashed on this one
    (dict(num_cpus_per_actor=0), ValueError, "num_cpus_per_actor"),
    (dict(num_cpus_per_actor="x"), ValueError, "num_cpus_per_actor"),
    (dict(address=5), TypeError, "address must be"),
    (dict(transport_options={"host": "x"}), ValueError, "unknown transport_options"),
    (dict(transport="tcp", transport_options={"port": 29500}), ValueError, "transport 'tcp' forms none"),
    (dict(transport="objectstore", transport_options={"ifname": "eth0"}), ValueError, "'objectstore' forms none"),
    (dict(transport="gloo", transport_options={"port": 70000}), ValueError, r"port'\] must be an int in 1..65535"),
    (dict(transport_options={"port": "29500"}), ValueError, "must be an int"),
    (dict(transport="gloo", transport_options={"ifname": ""}), ValueError, "network interface"),
]


def test_ray_engine_arguments_and_unreachable_cluster(ray_local):
    import time

    plan = casync.build_plan(SHAPES, workers=2)
    for kwargs, exc, needle in RAY_ARGS:
        kwargs = {"plan": plan, **kwargs}
        with pytest.raises(exc, match=needle):
            casync.RayEngine(kwargs.pop("plan"), **kwargs)
    with pytest.raises(casync.SyncTimeoutError, match=r"placement group of 2 actors \(2000 CPUs\) not ready"):
        casync.RayEngine(plan, num_cpus_per_actor=1000, timeout_s=2)  # bounded by timeout_s
    with casync.RayEngine(plan) as engine:  # Ray and the machine are fine afterwards
        assert len(engine.sync(make_grads(SHAPES, 2))) == 2
    from casync.runtime.ray_layer import _check_reachable

    started = time.monotonic()
    with pytest.raises(ConnectionError, match="no Ray cluster reachable at '127.0.0.1:1'"):
        _check_reachable("127.0.0.1:1")  # what connect_ray does first: ray.init would retry for minutes
    assert time.monotonic() - started < 10


# -- state ----------------------------------------------------------------------------------------------------------
def test_load_state_dict_rejects_and_keeps_state():
    plan = casync.build_plan(SHAPES, workers=2, codec="onebit")
    engine = casync.LocalEngine(plan)
    engine.sync(make_grads(SHAPES, 2))
    good = engine.state_dict()
    key = next(iter(good["residuals"]))
    cases = [
        (None, TypeError, "state must be a dict"), ({}, ValueError, "missing 'version'"),
        (dict(good, version=9), ValueError, "version 9"), (dict(good, step=-1), ValueError, "step"),
        (dict(good, step="1"), ValueError, "step"), (dict(good, workers=3), ValueError, "3 workers"),
        (dict(good, residuals=[]), TypeError, "residuals"),
        (dict(good, residuals={"ghost": np.zeros(3, np.float32)}), ValueError, "'ghost'"),
        (dict(good, residuals={key: good["residuals"][key].astype(np.float64)}), ValueError, "float32"),
        (dict(good, residuals={key: good["residuals"][key][:-1]}), ValueError, "shape"),
        (dict(good, residuals={key: np.full_like(good["residuals"][key], np.inf)}), ValueError, "NaN or Inf"),
    ]
    for state, exc, needle in cases:
        with pytest.raises(exc, match=needle):
            engine.load_state_dict(state)
        after = engine.state_dict()
        assert after["step"] == good["step"] and all(
            np.array_equal(after["residuals"][k], v) for k, v in good["residuals"].items())


# -- simulator, cluster model and profile files ---------------------------------------------------------------------
def test_simulate_rejects():
    plan = casync.build_plan(SHAPES, workers=2, bucket_bytes=0)
    cases = [
        (("plan",), {}, TypeError, "needs a SyncPlan"),
        ((plan, "cluster"), {}, TypeError, "ClusterModel"),
        ((plan, ClusterModel(nodes=1, workers_per_node=1)), {}, ValueError, "room for 1 workers"),
        ((plan,), dict(profile="profile.json"), TypeError, "Profile.load"),
        ((plan,), dict(ready_times=[1, 2]), TypeError, "mapping"),
        ((plan,), dict(ready_times={"ghost": 1.0}), ValueError, "ghost"),
        ((plan,), dict(ready_times={"a": float("nan")}), ValueError, r"ready_times\['a'\]"),
        ((plan,), dict(ready_times={"a": -1.0}), ValueError, r"ready_times\['a'\]"),
        ((plan,), dict(ready_times={"a": "soon"}), ValueError, r"ready_times\['a'\]"),
        ((plan,), dict(ready_times={"a": float("inf")}), ValueError, r"ready_times\['a'\]"),
    ]
    for args, kwargs, exc, needle in cases:
        with pytest.raises(exc, match=needle):
            casync.simulate(*args, **kwargs)
    assert casync.simulate(plan, ready_times={"a": 0.5}).iteration_time > 0.5


@pytest.mark.parametrize("kwargs,needle", [
    (dict(nodes=0), "nodes"), (dict(workers_per_node=1.5), "workers_per_node"), (dict(bandwidth_gbps=0), "bandwidth"),
    (dict(bandwidth_gbps=float("nan")), "bandwidth"), (dict(bandwidth_gbps=float("inf")), "bandwidth"),
    (dict(latency_us=-1), "latency"), (dict(latency_us=float("nan")), "latency"), (dict(compute_lanes=0), "lanes"),
    (dict(cores_per_node=0), "cores"), (dict(bandwidth_gbps="10"), "bandwidth"),
])
def test_cluster_model_rejects(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ClusterModel(**kwargs)


def test_cluster_for_workers_rejects():
    for args in ((0,), (-3,), (4, 0), (2.5,)):
        with pytest.raises(ValueError, match="workers"):
            ClusterModel.for_workers(*args)


def _profile_with(mutate):
    data = Profile.default().to_dict()
    mutate(data)
    return data


PROFILE_CASES = [
    ("version", lambda d: d.__setitem__("version", 99), "unsupported profile version 99"),
    ("no version", lambda d: d.pop("version"), "version"),
    ("missing merge", lambda d: d.pop("merge"), "missing 'merge'"),
    ("codecs list", lambda d: d.__setitem__("codecs", []), "'codecs' must be a non-empty object"),
    ("codec without decode", lambda d: d["codecs"]["onebit"].pop("decode"), "codec 'onebit' needs"),
    ("negative cost", lambda d: d["codecs"]["onebit"].__setitem__("encode", [-1, 0]), "codecs.onebit.encode"),
    ("infinite cost", lambda d: d["codecs"]["onebit"].__setitem__("encode", [float("inf"), 0]), "codecs.onebit.encode"),
    ("nan alpha", lambda d: d.__setitem__("transfer_alpha_s", float("nan")), "transfer_alpha_s"),
    ("zero beta", lambda d: d.__setitem__("transfer_beta_bps", 0), "transfer_beta_bps"),
    ("inf beta", lambda d: d.__setitem__("transfer_beta_bps", float("inf")), "transfer_beta_bps"),
    ("string overhead", lambda d: d.__setitem__("task_overhead_s", "1ms"), "task_overhead_s"),
    ("machine not object", lambda d: d.__setitem__("machine", 5), "'machine' must be an object"),
]


@pytest.mark.parametrize("label,mutate,needle", PROFILE_CASES, ids=[c[0] for c in PROFILE_CASES])
def test_malformed_profile_file(label, mutate, needle, tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(_profile_with(mutate)))
    with pytest.raises(ValueError, match=needle) as info:
        Profile.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content,needle", [(b"", "not valid JSON"), (b"\x80\x04\x95garbage", "not valid JSON"),
                                            (b"[]", "expected a JSON object"), (b'{"version": 1', "not valid JSON")])
def test_profile_file_not_json(content, needle, tmp_path):
    path = tmp_path / "profile.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=needle):
        Profile.load(path)


def test_profile_round_trip_still_loads(tmp_path):
    profile = Profile.default()
    assert Profile.load(profile.save(tmp_path / "p.json")).to_dict() == profile.to_dict()


# -- the CLI: non-zero exit, one line naming the problem, no traceback -----------------------------------------
CLI_CASES = [
    (["plan", "--model", "ghost"], "unknown model 'ghost'"),
    (["plan", "--model", "tiny", "--workers", "0"], "workers must be >= 1"),
    (["plan", "--model", "tiny", "--codec", "zstd"], "unknown codec 'zstd'"),
    (["plan", "--model", "tiny", "--codec", "topk:ratio=9"], "ratio"),
    (["plan", "--model", "tiny", "--strategy", "tree"], "unknown strategy 'tree'"),
    (["plan", "--model", "resnet50", "--partitions", "65536"], "would have about"),
    (["plan", "--model", "tiny", "--tensor", "ghost", "--table"], "no tensor named 'ghost'"),
    (["plan", "--model", "tiny", "--dot", "/nonexistent-dir/plan.dot"], "No such file or directory"),
    (["plan", "--model", "tiny", "--bucket-bytes", "-5"], "bucket_bytes must be >= 0"),
    (["simulate", "--model", "tiny", "--profile", "/nonexistent-dir/p.json"], "No such file or directory"),
    (["simulate", "--model", "tiny", "--bandwidth", "nan"], "bandwidth_gbps"),
    (["simulate", "--model", "tiny", "--latency-us", "-5"], "latency_us"),
    (["simulate", "--model", "tiny", "--workers", "0"], "workers must be an int >= 1"),
    (["simulate", "--model", "tiny", "--workers-per-node", "0"], "workers_per_node"),
    (["simulate", "--model", "tiny", "--partitions", "x"], "--partitions must be 'auto' or an int"),
    (["simulate", "--model", "tiny", "--backward-ms", "nan"], "total_backward_s"),
    (["simulate", "--model", "tiny", "--strategy", "ring,tree"], "unknown strategy 'tree'"),
    (["bench", "--model", "tiny", "--iters", "0", "--no-progress"], "--iters must be >= 1"),
    (["bench", "--model", "tiny", "--codecs", "zstd", "--no-progress"], "unknown codec 'zstd'"),
]


@pytest.mark.parametrize("argv,needle", CLI_CASES, ids=[" ".join(a[:4]) for a, _ in CLI_CASES])
def test_cli_bad_input_exits_with_one_line(argv, needle, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("casync: error: ") and needle in err[0], err


@pytest.mark.parametrize("argv,needle", [(["plan", "--workers", "abc"], "invalid int value: 'abc'"),
                                         (["simulate", "--bandwidth", "fast"], "invalid float value"),
                                         (["teleport"], "invalid choice"), ([], "required")])
def test_cli_argparse_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_cli_unreachable_cluster_fails_fast():
    """In a fresh process (no Ray yet): an address where nothing listens fails at once, not after minutes."""
    import subprocess
    import sys
    import time

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "casync", "bench", "--model", "tiny", "--baselines", "none", "--hooks", "none", "--address", "127.0.0.1:1",
                           "--no-progress"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "casync: error: no Ray cluster reachable at '127.0.0.1:1'" in done.stderr.strip().splitlines()[-1]
    assert time.monotonic() - started < 60


def test_engine_refuses_a_second_cluster_in_one_process(ray_local):
    plan = casync.build_plan(SHAPES, workers=2)
    with pytest.raises(ValueError, match="already connected to the Ray cluster at .*cannot also join '10.0.0.1:1'"):
        casync.RayEngine(plan, address="10.0.0.1:1")
    import ray

    from casync.runtime.ray_layer import connect_ray

    port = ray.get_runtime_context().gcs_address.rpartition(":")[2]
    with pytest.raises(ValueError, match=f"cannot also join '192.0.2.7:{port}'"):  # another host, the same port
        connect_ray(f"192.0.2.7:{port}")
    for same in (f"127.0.0.1:{port}", f"localhost:{port}"):  # this machine's cluster under another name
        assert connect_ray(same) is False


def test_cli_plan_by_tensor_name_shows_its_bucket(capsys):
    assert cli.main(["plan", "--model", "tiny", "--tensor", "fc1.weight", "--table"]) == 0
    assert "bucket" in capsys.readouterr().out


def test_plan_file_errors_are_value_errors(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"format": "casync.plan", "version": 1}')
    with pytest.raises(PlanFormatError, match="workers: missing") as info:
        casync.SyncPlan.load(str(path))
    assert isinstance(info.value, ValueError)


def test_local_engine_run_flat_names_the_worker_of_a_non_mapping_or_an_extra_bucket():
    plan = casync.build_plan(SHAPES, workers=2, codec="onebit")
    engine = casync.LocalEngine(plan)
    flats, _ = flatten_worker_grads(plan, _clean_grads(0))
    bucket = plan.buckets[0].name
    with pytest.raises(TypeError, match="worker 1: expected a mapping bucket->array, got list"):
        engine.run_flat([flats[0], [flats[1][bucket]]])
    with pytest.raises(ValueError, match=r"worker 0: unexpected bucket\(s\) \['nope'\] not in the plan"):
        engine.run_flat([dict(flats[0], nope=np.zeros(3, np.float32)), flats[1]])
    assert engine.step == 0 and len(engine.run_flat(flats)) == 2
