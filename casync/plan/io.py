"""Plans on disk: versioned JSON (never pickle), validated field by field on load.

``plan.save(path)`` / ``SyncPlan.load(path)`` use :func:`plan_to_dict` / :func:`plan_from_dict`.  A file
names its format and version; codecs are stored by their spec (``get_codec`` rebuilds them, so a custom
codec must be registered before loading); the graph is stored node by node with its plain-data
attributes.  Loading checks every field's type, then runs :func:`casync.plan.lint.lint` (the graph agrees
with the buckets: partitions, actors, send/recv pairs, codecs, one output per worker and partition), and
raises :class:`casync.errors.PlanFormatError` naming the file and the offending field.

Version 2 names a node's bucket ``bucket``; version 1 files (which called it ``tensor``) still load.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import networkx as nx

from casync.primitives.codecs import Codec, get_codec
from casync.primitives.ir import RENAMED_ATTRS
from casync.strategies import STRATEGIES

from ..errors import PlanError, PlanFormatError
from .checks import NONFINITE_MODES
from .lint import check_node_attrs, lint

if TYPE_CHECKING:
    from .syncplan import SyncPlan
from .specs import Bucket, Member, TensorSpec

PLAN_FORMAT = "casync.plan"
PLAN_VERSION = 2
READABLE_VERSIONS = (1, 2)

_INT = ("an int", lambda v: isinstance(v, int) and not isinstance(v, bool))
_NONNEG = ("an int >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
_STR = ("a non-empty string", lambda v: isinstance(v, str) and v != "")
_BOOL = ("true or false", lambda v: isinstance(v, bool))
_POS = ("an int >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)


# -- writing -------------------------------------------------------------------------------------------
def _json_value(value: Any, where: str) -> Any:
    """``value`` as plain JSON data (tuples become lists); TypeError naming ``where`` for anything else."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where}: {value!r} cannot be stored in a plan file (JSON has no inf/nan)")
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {k!r} is not a string; plan files need string keys")
            out[k] = _json_value(v, f"{where}.{k}")
        return out
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():  # numpy scalar
        return _json_value(value.item(), where)
    raise TypeError(f"{where}: {type(value).__name__} {value!r} cannot be stored in a plan file")


def _codec_spec(codec: Codec, where: str) -> list:
    name, params = codec.spec()
    return [name, _json_value(params, f"{where}.params")]


def plan_to_dict(plan: SyncPlan) -> dict[str, Any]:
    """The plan as plain JSON-able data (format name and version first)."""
    graph = plan.graph
    nodes = [[node, _json_value(dict(attrs), f"graph.nodes[{node!r}]")] for node, attrs in graph.nodes(data=True)]
    edges = [[u, v, _json_value(slot, f"graph.edges[{u!r}, {v!r}].slot")]
             for u, v, slot in graph.edges(data="slot", default=0)]
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "workers": plan.workers,
        "compact": plan.compact,
        "options": _json_value(plan.options, "options"),
        "codecs": {key: _codec_spec(codec, f"codecs[{key!r}]") for key, codec in sorted(plan.codecs.items())},
        "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in plan.tensors],
        "buckets": [{
            "name": b.name, "members": [{"tensor": m.spec.name, "offset": m.offset} for m in b.members],
            "strategy": b.strategy, "codec": _codec_spec(b.codec, f"buckets[{i}].codec"),
            "partitions": [list(p) for p in b.partitions], "priority": b.priority, "two_way": b.two_way,
            "servers": b.servers, "error_feedback": b.error_feedback, "note": b.note,
            "extra": _json_value(b.extra, f"buckets[{i}].extra"),
        } for i, b in enumerate(plan.buckets)],
        "graph": {"nodes": nodes, "edges": edges},
    }


def save_plan(plan: SyncPlan, path: str | Path) -> Path:
    """Write ``plan`` as JSON to ``path`` (the data is checked first, so a failed save writes nothing)."""
    text = json.dumps(plan_to_dict(plan), separators=(",", ":"), allow_nan=False)
    path = Path(path)
    path.write_text(text + "\n")
    return path


# -- reading -------------------------------------------------------------------------------------------
class _Reader:
    """Typed field access that names the source file and the field path in every error."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, message: str) -> PlanFormatError:
        return PlanFormatError(f"{self.source}: {where}: {message}")

    def field(self, obj: Mapping[str, Any], key: str, where: str, check: tuple[str, Callable[[Any], bool]]) -> Any:
        path = f"{where}.{key}" if where else key
        if key not in obj:
            raise self.fail(path, "missing")
        value = obj[key]
        if not check[1](value):
            raise self.fail(path, f"expected {check[0]}, got {value!r}"[:300])
        return value

    def mapping(self, obj: Mapping[str, Any], key: str, where: str) -> dict:
        return self.field(obj, key, where, ("an object", lambda v: isinstance(v, dict)))

    def array(self, obj: Mapping[str, Any], key: str, where: str) -> list:
        return self.field(obj, key, where, ("a list", lambda v: isinstance(v, list)))

    def codec(self, value: Any, where: str) -> Codec:
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                and isinstance(value[1], dict)):
            raise self.fail(where, f"expected a codec spec [name, {{params}}], got {value!r}"[:300])
        try:
            return get_codec((value[0], value[1]))
        except (ValueError, TypeError) as exc:
            raise self.fail(where, str(exc)) from None


def _read_tensors(r: _Reader, data: dict) -> list[TensorSpec]:
    specs, seen = [], set()
    for i, item in enumerate(r.array(data, "tensors", "")):
        where = f"tensors[{i}]"
        if not isinstance(item, dict):
            raise r.fail(where, f"expected an object, got {item!r}")
        name = r.field(item, "name", where, _STR)
        shape = r.field(item, "shape", where, ("a list of ints >= 0",
                                               lambda v: isinstance(v, list) and all(_NONNEG[1](d) for d in v)))
        dtype = item.get("dtype", "float32")
        if dtype != "float32":
            raise r.fail(f"{where}.dtype", f"only 'float32' is supported, got {dtype!r}")
        if name in seen:
            raise r.fail(f"{where}.name", f"tensor {name!r} appears twice")
        seen.add(name)
        specs.append(TensorSpec(name, tuple(shape)))
    if not specs:
        raise r.fail("tensors", "a plan needs at least one tensor")
    return specs


def _read_buckets(r: _Reader, data: dict, specs: list[TensorSpec]) -> list[Bucket]:
    by_name = {s.name: s for s in specs}
    placed: dict[str, str] = {}
    buckets, names = [], set()
    for i, item in enumerate(r.array(data, "buckets", "")):
        where = f"buckets[{i}]"
        if not isinstance(item, dict):
            raise r.fail(where, f"expected an object, got {item!r}")
        name = r.field(item, "name", where, _STR)
        if name in names:
            raise r.fail(f"{where}.name", f"bucket {name!r} appears twice")
        names.add(name)
        members, offset = [], 0
        for j, m in enumerate(r.array(item, "members", where)):
            mwhere = f"{where}.members[{j}]"
            if not isinstance(m, dict):
                raise r.fail(mwhere, f"expected an object, got {m!r}")
            tensor = r.field(m, "tensor", mwhere, _STR)
            if tensor not in by_name:
                raise r.fail(f"{mwhere}.tensor", f"no tensor named {tensor!r} in 'tensors'")
            if tensor in placed:
                raise r.fail(f"{mwhere}.tensor", f"tensor {tensor!r} is already in bucket {placed[tensor]!r}")
            placed[tensor] = name
            if r.field(m, "offset", mwhere, _NONNEG) != offset:
                raise r.fail(f"{mwhere}.offset", f"expected {offset} (members are packed in order), got {m['offset']}")
            members.append(Member(by_name[tensor], offset))
            offset += by_name[tensor].numel
        if not members:
            raise r.fail(f"{where}.members", "a bucket needs at least one tensor")
        strategy = r.field(item, "strategy", where, _STR)
        if strategy not in STRATEGIES:
            raise r.fail(f"{where}.strategy", f"unknown strategy {strategy!r}; expected one of {sorted(STRATEGIES)} "
                                              "(register a custom strategy before loading)")
        codec = r.codec(item.get("codec"), f"{where}.codec")
        bounds = r.array(item, "partitions", where)
        start = 0
        for j, p in enumerate(bounds):
            if not (isinstance(p, list) and len(p) == 2 and all(_NONNEG[1](v) for v in p) and p[0] == start
                    and p[1] >= p[0]):
                raise r.fail(f"{where}.partitions[{j}]", f"expected [{start}, stop] with stop >= {start}, got {p!r}")
            start = p[1]
        if not bounds or start != offset:
            raise r.fail(f"{where}.partitions", f"must cover [0, {offset}) contiguously, got {bounds!r}"[:300])
        buckets.append(Bucket(
            name=name, members=members, strategy=strategy, codec=codec, partitions=[tuple(p) for p in bounds],
            priority=r.field(item, "priority", where, _INT), two_way=r.field(item, "two_way", where, _BOOL),
            servers=r.field(item, "servers", where, ("null or an int >= 1", lambda v: v is None or _POS[1](v))),
            error_feedback=r.field(item, "error_feedback", where, _BOOL),
            note=r.field(item, "note", where, ("a string", lambda v: isinstance(v, str))),
            extra=dict(r.field(item, "extra", where, ("an object", lambda v: isinstance(v, dict)))
                       if "extra" in item else {})))
    missing = [s.name for s in specs if s.name not in placed]
    if missing:
        raise r.fail("buckets", f"tensor(s) {missing[:5]} are in no bucket")
    if not buckets:
        raise r.fail("buckets", "a plan needs at least one bucket")
    return buckets


def _read_graph(r: _Reader, data: dict, workers: int, version: int) -> nx.DiGraph:
    """The node and edge lists as a DiGraph, every node's attributes typed (``casync.primitives.ir``)."""
    graph_data = r.mapping(data, "graph", "")
    graph = nx.DiGraph()
    for i, item in enumerate(r.array(graph_data, "nodes", "graph")):
        where = f"graph.nodes[{i}]"
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)):
            raise r.fail(where, f"expected [node id, {{attributes}}], got {item!r}"[:300])
        node, attrs = item
        if node in graph:
            raise r.fail(f"graph node {node!r}", "appears twice")
        if version == 1:
            attrs = {RENAMED_ATTRS.get(k, k): v for k, v in attrs.items()}
        try:
            check_node_attrs(node, attrs, workers)
        except PlanError as exc:
            raise PlanFormatError(f"{r.source}: {exc}") from None
        graph.add_node(node, **attrs)
    for i, item in enumerate(r.array(graph_data, "edges", "graph")):
        where = f"graph.edges[{i}]"
        if not (isinstance(item, list) and len(item) == 3 and item[0] in graph and item[1] in graph
                and _NONNEG[1](item[2])):
            raise r.fail(where, f"expected [source node, target node, slot >= 0] of known nodes, got {item!r}"[:300])
        graph.add_edge(item[0], item[1], slot=item[2])
    return graph


def plan_from_dict(data: Any, source: str, cls: type[SyncPlan]) -> SyncPlan:
    """Rebuild a plan from :func:`plan_to_dict` output, validating everything (see the module docstring)."""
    r = _Reader(source)
    if not isinstance(data, dict):
        raise r.fail("top level", f"expected a JSON object, got {type(data).__name__}")
    fmt = data.get("format")
    if fmt != PLAN_FORMAT:
        raise r.fail("format", f"expected {PLAN_FORMAT!r}, got {fmt!r} (not a casync plan file)")
    version = data.get("version")
    if version not in READABLE_VERSIONS:
        raise r.fail("version", f"unsupported plan version {version!r} (this casync reads versions "
                                f"{', '.join(map(str, READABLE_VERSIONS))})")
    workers = r.field(data, "workers", "", _POS)
    compact = r.field(data, "compact", "", _BOOL)
    options = r.mapping(data, "options", "")
    if options.get("workers", workers) != workers:
        raise r.fail("options.workers", f"{options['workers']!r} disagrees with workers={workers}")
    mode = options.get("nonfinite", "raise")
    if mode not in NONFINITE_MODES:
        raise r.fail("options.nonfinite", f"expected one of {list(NONFINITE_MODES)}, got {mode!r}")
    if not _NONNEG[1](options.get("seed", 0)):
        raise r.fail("options.seed", f"expected an int >= 0, got {options.get('seed')!r}")
    codecs = {}
    for key, spec in r.mapping(data, "codecs", "").items():
        codec = r.codec(spec, f"codecs[{key!r}]")
        if str(codec) != key:
            raise r.fail(f"codecs[{key!r}]", f"the spec builds codec {str(codec)!r}, not {key!r}")
        codecs[key] = codec
    specs = _read_tensors(r, data)
    buckets = _read_buckets(r, data, specs)
    graph = _read_graph(r, data, workers, version)
    if "codec" in options and isinstance(options["codec"], list) and len(options["codec"]) == 2 \
            and isinstance(options["codec"][0], str) and isinstance(options["codec"][1], dict):
        options = dict(options, codec=tuple(options["codec"]))  # build_plan stores the codec spec as a tuple
    plan = cls(graph=graph, tensors=specs, buckets=buckets, workers=workers, codecs=codecs, options=options,
                    compact=compact)
    try:
        lint(plan, attrs=False)  # attributes were checked node by node above
    except PlanError as exc:
        raise PlanFormatError(f"{r.source}: {exc}") from None
    return plan


def load_plan(path: str | Path, cls: type[SyncPlan]) -> SyncPlan:
    """Read a plan written by :func:`save_plan`; every field is validated, nothing is unpickled."""
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise PlanFormatError(f"{path}: not a text (JSON) file") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise PlanFormatError(f"{path}: not valid JSON ({exc})") from None
    except ValueError as exc:  # NaN / Infinity literals
        raise PlanFormatError(f"{path}: {exc}") from None
    return plan_from_dict(data, str(path), cls)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a plan file (JSON has no inf/nan)")
