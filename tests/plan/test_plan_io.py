"""Plans on disk: JSON round trips, bit-identical runs of loaded plans, and typed errors for bad files."""
from __future__ import annotations

import copy
import json

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import casync
from casync.errors import PlanFormatError
from casync.plan.assemble import BucketChoice, assemble_plan, make_buckets, name_buckets
from casync.plan.io import PLAN_FORMAT, PLAN_VERSION
from casync.plan.tensors import tensor_specs
from casync.primitives.codecs import get_codec
from tests.helpers import make_grads

SHAPES = {"w": (300,), "m": (13, 7), "s": (), "b": (5,)}
CONFIGS = {
    "ring-onebit": dict(strategy="ring", codec="onebit", workers=3),
    "ps-dedicated-topk": dict(strategy="ps", servers=2, codec="topk:ratio=0.1", workers=3),
    "ps-oneway-qsgd": dict(strategy="ps", two_way=False, codec="qsgd:levels=15", workers=2),
    "allgather-randomk-sum": dict(strategy="allgather", codec="randomk:ratio=0.2", workers=4, op="sum"),
    "ring-none-skip": dict(strategy="ring", codec=None, workers=2, nonfinite="skip", partitions=5),
}


def _plan(name: str) -> casync.SyncPlan:
    return casync.build_plan(SHAPES, bucket_bytes=512, seed=7, **CONFIGS[name])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip_is_equal_and_plain_json(name, tmp_path):
    plan = _plan(name)
    path = plan.save(str(tmp_path / "plan.json"))
    text = open(path).read()
    data = json.loads(text)  # plain JSON, never a pickle
    assert data["format"] == PLAN_FORMAT and data["version"] == PLAN_VERSION
    loaded = casync.SyncPlan.load(path)
    assert loaded == plan and loaded.to_dict() == plan.to_dict()
    assert nx.utils.graphs_equal(loaded.graph, plan.graph)
    assert loaded.codecs == plan.codecs and loaded.options == plan.options
    assert [(b.name, b.partitions, b.codec) for b in loaded.buckets] == [(b.name, b.partitions, b.codec)
                                                                         for b in plan.buckets]
    assert loaded.summary() == plan.summary()


def test_planner_and_compact_plans_round_trip(tmp_path):
    auto = casync.build_plan("tiny", workers=4, strategy="auto", codec="auto", partitions="auto")
    assert casync.SyncPlan.load(auto.save(str(tmp_path / "auto.json"))) == auto
    specs = tensor_specs("tiny")
    groups = name_buckets(specs, make_buckets(specs, 1 << 14))
    compact = assemble_plan(specs, 64, groups, [BucketChoice("ring", get_codec("onebit"))] * len(groups),
                            compact=True)
    loaded = casync.SyncPlan.load(compact.save(str(tmp_path / "compact.json")))
    assert loaded == compact and loaded.compact
    assert casync.simulate(loaded).iteration_time == casync.simulate(compact).iteration_time


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_loaded_plan_runs_bit_identically_on_local_engine(name, tmp_path):
    plan = _plan(name)
    loaded = casync.SyncPlan.load(plan.save(str(tmp_path / "plan.json")))
    original, reloaded = casync.LocalEngine(plan), casync.LocalEngine(loaded)
    for step in range(3):  # error feedback evolves identically
        grads = make_grads(SHAPES, plan.workers, seed=step)
        a, b = original.sync(grads), reloaded.sync(grads)
        for w in range(plan.workers):
            for tensor in SHAPES:
                np.testing.assert_array_equal(a[w][tensor], b[w][tensor])
    sa, sb = original.state_dict(), reloaded.state_dict()
    assert sa["residuals"].keys() == sb["residuals"].keys()
    for key in sa["residuals"]:
        np.testing.assert_array_equal(sa["residuals"][key], sb["residuals"][key])


def test_loaded_plan_runs_bit_identically_on_ray_engine(ray_local, tmp_path):
    plan = _plan("ps-dedicated-topk")
    loaded = casync.SyncPlan.load(plan.save(str(tmp_path / "plan.json")))
    local = casync.LocalEngine(plan)
    with casync.RayEngine(loaded, timeout_s=60) as engine:
        for step in range(2):
            grads = make_grads(SHAPES, plan.workers, seed=step)
            expected, got = local.sync(grads), engine.sync(grads)
            for w in range(plan.workers):
                for tensor in SHAPES:
                    np.testing.assert_array_equal(got[w][tensor], expected[w][tensor])


def test_save_refuses_what_json_cannot_hold(tmp_path):
    plan = _plan("ring-onebit")
    plan.options["callback"] = print
    with pytest.raises(TypeError, match="options.callback"):
        plan.save(str(tmp_path / "plan.json"))
    assert not (tmp_path / "plan.json").exists()


# -- malformed files: each names the field ---------------------------------------------------------------
def _first_node(data, op):
    return next(attrs for _, attrs in data["graph"]["nodes"] if attrs["op"] == op)


def _mutations():
    """(label, mutate(data), what the error message must mention)."""
    def set_(path, value):
        def apply(d):
            target = d
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        return apply

    def delete(path):
        def apply(d):
            target = d
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]
        return apply

    def node(op, key, value):
        return lambda d: _first_node(d, op).__setitem__(key, value)

    return [
        ("wrong format", set_(["format"], "pickle"), "format"),
        ("future version", set_(["version"], 99), "version 99"),
        ("missing workers", delete(["workers"]), "workers: missing"),
        ("workers not int", set_(["workers"], "4"), "workers: expected an int >= 1"),
        ("options workers disagree", set_(["options", "workers"], 99), "options.workers"),
        ("bad nonfinite mode", set_(["options", "nonfinite"], "ignore"), "options.nonfinite"),
        ("unknown codec", set_(["buckets", 0, "codec"], ["zstd", {}]), "unknown codec 'zstd'"),
        ("codec bad param", set_(["buckets", 0, "codec"], ["topk", {"ratio": 7}]), "ratio"),
        ("codec table key", lambda d: d["codecs"].__setitem__("onebit", ["fp16", {}]), "codecs['onebit']"),
        ("unknown strategy", set_(["buckets", 0, "strategy"], "tree"), "unknown strategy 'tree'"),
        ("tensor shape", set_(["tensors", 0, "shape"], [-3]), "tensors[0].shape"),
        ("tensor dtype", set_(["tensors", 0, "dtype"], "int8"), "tensors[0].dtype"),
        ("duplicate tensor", lambda d: d["tensors"].append(dict(d["tensors"][0])), "appears twice"),
        ("no tensors", set_(["tensors"], []), "at least one tensor"),
        ("member unknown", set_(["buckets", 0, "members", 0, "tensor"], "ghost"), "no tensor named 'ghost'"),
        ("member offset", set_(["buckets", 0, "members", 0, "offset"], 5), "members[0].offset"),
        ("partitions gap", set_(["buckets", 0, "partitions", 0], [1, 2]), "partitions[0]"),
        ("partitions short", lambda d: d["buckets"][0]["partitions"].pop(), "buckets[0].partitions"),
        ("node numel", node("encode", "numel", 10**6), "numel"),
        ("node bucket", node("merge", "bucket", "ghost"), "no bucket named 'ghost'"),
        ("node actor", node("decode", "actor", "worker:99"), "worker:99"),
        ("node op", node("send", "op", "teleport"), "op"),
        ("node codec", node("decode", "codec", "lz4"), "codec 'lz4' is not in 'codecs'"),
        ("node attr object", node("encode", "seed_key", {"x": 1}), "seed_key"),
        ("ef flag", node("encode", "ef", False), ".ef"),
        ("lost output", lambda d: [a.__setitem__("output", False) for _, a in d["graph"]["nodes"]
                                   if a.get("output")], "output nodes"),
        ("edge to nowhere", lambda d: d["graph"]["edges"].append(["ghost", d["graph"]["nodes"][0][0], 0]),
         "graph.edges"),
        ("cycle", lambda d: d["graph"]["edges"].append([d["graph"]["edges"][0][1], d["graph"]["edges"][0][0], 0]),
         "graph"),
        ("graph missing", delete(["graph"]), "graph: missing"),
        ("top level list", lambda d: d.clear(), "format"),
    ]


@pytest.mark.parametrize("label,mutate,needle", _mutations(), ids=[m[0] for m in _mutations()])
def test_malformed_plan_dict_names_the_field(label, mutate, needle, tmp_path):
    data = _plan("ring-onebit").to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFormatError) as info:
        casync.SyncPlan.load(str(path))
    assert needle in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("content,needle", [
    (b"", "not valid JSON"), (b"\x80\x04\x95 pickle", "not a text"), (b"[1, 2]", "expected a JSON object"),
    (b'{"format": "casync.plan", "version": 1, "workers": NaN}', "NaN"), (b"{not json", "not valid JSON"),
])
def test_malformed_plan_file(content, needle, tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(PlanFormatError, match=needle):
        casync.SyncPlan.load(str(path))


def test_missing_plan_file_is_a_file_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        casync.SyncPlan.load(str(tmp_path / "nope.json"))


_JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=False),
                         st.text(max_size=8), st.lists(st.integers(-1, 5), max_size=3),
                         st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_single_corruption_is_rejected_or_harmless(data):
    """Replace or delete one field anywhere in a plan: loading raises PlanFormatError, or the plan runs."""
    plan = _plan("ps-dedicated-topk")
    doc = plan.to_dict()
    paths = []

    def walk(obj, path):
        if isinstance(obj, dict):
            for k, v in obj.items():
                paths.append(path + [k])
                walk(v, path + [k])
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                paths.append(path + [i])
                walk(v, path + [i])

    walk(doc, [])
    path = data.draw(st.sampled_from(paths), label="path")
    corrupted = copy.deepcopy(doc)
    parent = corrupted
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans(), label="delete") and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(_JSON_VALUES, label="value")
    try:
        loaded = casync.SyncPlan.from_dict(json.loads(json.dumps(corrupted)))
    except PlanFormatError:
        return
    try:
        engine = casync.LocalEngine(loaded)
    except ValueError as exc:  # a full plan marked compact: engines refuse it, by name
        assert "compact" in str(exc)
        return
    out = engine.sync(make_grads({t.name: t.shape for t in loaded.tensors}, loaded.workers))
    assert len(out) == loaded.workers
