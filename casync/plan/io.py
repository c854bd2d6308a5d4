"""Plans on disk: versioned JSON (never pickle), validated field by field on load.

``plan.save(path)`` / ``SyncPlan.load(path)`` use :func:`plan_to_dict` / :func:`plan_from_dict`.  A file
names its format and version; codecs are stored by their spec (``get_codec`` rebuilds them, so a custom
codec must be registered before loading); the graph is stored node by node with its plain-data
attributes.  Loading checks every field's type and that the graph agrees with the buckets (tensor names,
partitions, actors, send/recv pairs, one output per worker and partition), and raises
:class:`casync.errors.PlanFormatError` naming the offending field.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping

import networkx as nx

from primitives.codecs import Codec, get_codec
from strategies import OPS, STRATEGIES

from ..engines.nonfinite import MODES as NONFINITE_MODES
from ..errors import PlanFormatError
from .specs import Bucket, Member, TensorSpec
from .syncplan import SyncPlan

PLAN_FORMAT = "casync.plan"
PLAN_VERSION = 1

# node attribute -> (check, what it must be); per op, the attributes it must carry
_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool), "an int")
_NONNEG = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an int >= 0")
_STR = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_OPT_STR = (lambda v: v is None or (isinstance(v, str) and v != ""), "null or a non-empty string")
_OPT_NONNEG = (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0), "null or an int >= 0")
_POS = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1")
_COMMON = {"op": _STR, "actor": _STR, "tensor": _STR, "part": _NONNEG, "numel": _NONNEG, "priority": _INT,
           "nbytes": _NONNEG}
_PER_OP = {
    "encode": {"codec": _STR, "local_input": _BOOL, "ef": _BOOL, "ef_key": _OPT_STR, "seed_key": _NONNEG},
    "decode": {"codec": _STR, "output": _BOOL},
    "merge": {"local_input": _BOOL, "local_slot": _OPT_NONNEG, "divisor": _POS, "output": _BOOL},
    "send": {"peer": _STR, "codec": _STR, "stage": _STR},
    "recv": {"peer": _STR, "codec": _STR, "stage": _STR},
}
_OPTIONAL = {"round": _NONNEG}


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
    if not isinstance(plan, SyncPlan):
        raise TypeError(f"save_plan needs a SyncPlan, got {type(plan).__name__}")
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

    def field(self, obj: Mapping[str, Any], key: str, where: str, check: tuple[Callable[[Any], bool], str]) -> Any:
        path = f"{where}.{key}" if where else key
        if key not in obj:
            raise self.fail(path, "missing")
        value = obj[key]
        if not check[0](value):
            raise self.fail(path, f"expected {check[1]}, got {value!r}"[:300])
        return value

    def mapping(self, obj: Mapping[str, Any], key: str, where: str) -> dict:
        return self.field(obj, key, where, (lambda v: isinstance(v, dict), "an object"))

    def array(self, obj: Mapping[str, Any], key: str, where: str) -> list:
        return self.field(obj, key, where, (lambda v: isinstance(v, list), "a list"))

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
        shape = r.field(item, "shape", where, (lambda v: isinstance(v, list) and all(_NONNEG[0](d) for d in v),
                                               "a list of ints >= 0"))
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
            raise r.fail(f"{where}.strategy", f"unknown strategy {strategy!r}; expected one of {sorted(STRATEGIES)}")
        codec = r.codec(item.get("codec"), f"{where}.codec")
        bounds = r.array(item, "partitions", where)
        start = 0
        for j, p in enumerate(bounds):
            if not (isinstance(p, list) and len(p) == 2 and all(_NONNEG[0](v) for v in p) and p[0] == start
                    and p[1] >= p[0]):
                raise r.fail(f"{where}.partitions[{j}]", f"expected [{start}, stop] with stop >= {start}, got {p!r}")
            start = p[1]
        if not bounds or start != offset:
            raise r.fail(f"{where}.partitions", f"must cover [0, {offset}) contiguously, got {bounds!r}"[:300])
        buckets.append(Bucket(
            name=name, members=members, strategy=strategy, codec=codec, partitions=[tuple(p) for p in bounds],
            priority=r.field(item, "priority", where, _INT), two_way=r.field(item, "two_way", where, _BOOL),
            servers=r.field(item, "servers", where, (lambda v: v is None or _POS[0](v), "null or an int >= 1")),
            error_feedback=r.field(item, "error_feedback", where, _BOOL),
            note=r.field(item, "note", where, (lambda v: isinstance(v, str), "a string")),
            extra=dict(r.field(item, "extra", where, (lambda v: isinstance(v, dict), "an object"))
                       if "extra" in item else {})))
    missing = [s.name for s in specs if s.name not in placed]
    if missing:
        raise r.fail("buckets", f"tensor(s) {missing[:5]} are in no bucket")
    if not buckets:
        raise r.fail("buckets", "a plan needs at least one bucket")
    return buckets


def _read_graph(r: _Reader, data: dict, workers: int, buckets: list[Bucket], codecs: dict[str, Codec],
                compact: bool) -> nx.DiGraph:
    graph_data = r.mapping(data, "graph", "")
    bounds = {b.name: b.partitions for b in buckets}
    graph = nx.DiGraph()
    actors: set[str] = set()
    for i, item in enumerate(r.array(graph_data, "nodes", "graph")):
        where = f"graph.nodes[{i}]"
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)):
            raise r.fail(where, f"expected [node id, {{attributes}}], got {item!r}"[:300])
        node, attrs = item
        where = f"graph node {node!r}"
        if node in graph:
            raise r.fail(where, "appears twice")
        op = attrs.get("op")
        if op not in OPS:
            raise r.fail(f"{where}.op", f"expected one of {list(OPS)}, got {op!r}")
        for key, check in {**_COMMON, **_PER_OP[op]}.items():
            r.field(attrs, key, where, check)
        for key, check in _OPTIONAL.items():
            if key in attrs:
                r.field(attrs, key, where, check)
        for key, value in attrs.items():
            if not (value is None or isinstance(value, (bool, int, float, str))):
                raise r.fail(f"{where}.{key}", f"node attributes must be plain scalars, got {value!r}"[:300])
        actor = attrs["actor"]
        _check_actor(r, actor, workers, f"{where}.actor")
        actors.add(actor)
        if "peer" in attrs:
            _check_actor(r, attrs["peer"], workers, f"{where}.peer")
        if attrs["tensor"] not in bounds:
            raise r.fail(f"{where}.tensor", f"no bucket named {attrs['tensor']!r}")
        parts = bounds[attrs["tensor"]]
        if attrs["part"] >= len(parts):
            raise r.fail(f"{where}.part", f"bucket {attrs['tensor']!r} has {len(parts)} partition(s), got {attrs['part']}")
        size = parts[attrs["part"]][1] - parts[attrs["part"]][0]
        if attrs["numel"] != size:
            raise r.fail(f"{where}.numel", f"partition {attrs['part']} of {attrs['tensor']!r} has {size} elements, "
                                           f"got {attrs['numel']}")
        if "codec" in attrs and attrs["codec"] not in codecs:
            raise r.fail(f"{where}.codec", f"codec {attrs['codec']!r} is not in 'codecs'")
        if attrs.get("local_input") and not actor.startswith("worker:"):
            raise r.fail(f"{where}.local_input", f"only workers have local gradients, not {actor!r}")
        if op == "encode" and attrs["ef"] and attrs["ef_key"] is None:
            raise r.fail(f"{where}.ef_key", "an encode with error feedback needs an ef_key")
        graph.add_node(node, **attrs)
    for i, item in enumerate(r.array(graph_data, "edges", "graph")):
        where = f"graph.edges[{i}]"
        if not (isinstance(item, list) and len(item) == 3 and item[0] in graph and item[1] in graph
                and _NONNEG[0](item[2])):
            raise r.fail(where, f"expected [source node, target node, slot >= 0] of known nodes, got {item!r}"[:300])
        graph.add_edge(item[0], item[1], slot=item[2])
    if not nx.is_directed_acyclic_graph(graph):
        raise r.fail("graph", "has a cycle")
    _check_structure(r, graph, workers, bounds, compact)
    _check_codecs(r, graph, {b.name: b for b in buckets})
    return graph


def _check_actor(r: _Reader, actor: str, workers: int, where: str) -> None:
    kind, _, index = actor.partition(":")
    if kind not in ("worker", "server") or not index.isdigit() or (kind == "worker" and int(index) >= workers):
        raise r.fail(where, f"expected 'worker:<0..{workers - 1}>' or 'server:<i>', got {actor!r}")


def _check_structure(r: _Reader, graph: nx.DiGraph, workers: int, bounds: dict[str, list], compact: bool) -> None:
    """What an engine relies on: inputs per op, send -> recv pairs, one output per worker and partition."""
    ef_keys: Counter[str] = Counter()
    outputs: Counter[tuple[str, str, int]] = Counter()
    for node, a in graph.nodes(data=True):
        where = f"graph node {node!r}"
        preds = list(graph.predecessors(node))
        slots = sorted(graph.edges[u, node]["slot"] for u in preds)
        op = a["op"]
        local = bool(a.get("local_input"))
        if op == "merge":
            total = len(preds) + local
            if local and not (a["local_slot"] is not None and a["local_slot"] < total):
                raise r.fail(f"{where}.local_slot", f"must be < {total} for a merge of {total} inputs")
            expected = [s for s in range(total) if not (local and s == a["local_slot"])]
            if slots != expected:
                raise r.fail(where, f"merge input slots {slots} do not match {expected}")
        elif op == "encode":
            if len(preds) != (0 if local else 1):
                raise r.fail(where, f"an encode {'of the local gradient ' if local else ''}takes "
                                    f"{0 if local else 1} input(s), has {len(preds)}")
        elif len(preds) != 1:
            raise r.fail(where, f"a {op} takes exactly one input, has {len(preds)}")
        for u in preds:
            ua = graph.nodes[u]
            if (ua["tensor"], ua["part"]) != (a["tensor"], a["part"]):
                raise r.fail(where, f"input {u!r} belongs to another tensor/partition")
            if ua["actor"] != a["actor"] and not (op == "recv" and ua["op"] == "send"):
                raise r.fail(where, f"data from {u!r} crosses actors outside a send -> recv pair")
        if op == "recv":
            (send,) = preds
            sa = graph.nodes[send]
            if sa["op"] != "send" or sa["codec"] != a["codec"] or sa["nbytes"] != a["nbytes"]:
                raise r.fail(where, f"must receive from a send of the same codec and size, got {send!r}")
            if not compact and (sa["peer"] != a["actor"] or a["peer"] != sa["actor"]):
                raise r.fail(where, f"peer mismatch with {send!r}")
        if op == "send" and list(graph.successors(node)) and \
                any(graph.nodes[s]["op"] != "recv" for s in graph.successors(node)):
            raise r.fail(where, "a send feeds only its recv")
        if op == "encode" and a["ef"]:
            ef_keys[a["ef_key"]] += 1
        if a.get("output"):
            outputs[(a["actor"], a["tensor"], a["part"])] += 1
    twice = [k for k, c in ef_keys.items() if c > 1]
    if twice and not compact:  # a template reuses one worker's keys for its symmetric hops
        raise r.fail("graph", f"error-feedback key {twice[0]!r} is used by several encodes")
    owners = [f"worker:{w}" for w in range(1 if compact else workers)]
    for tensor, parts in ({} if compact else bounds).items():  # templates cover representative partitions only
        for actor in owners:
            for part in range(len(parts)):
                count = outputs.get((actor, tensor, part), 0)
                if count != 1:
                    raise r.fail("graph", f"{actor} has {count} output nodes for bucket {tensor!r} partition {part} "
                                          "(expected exactly one)")
    stray = [k for k in outputs if k[0] not in owners]
    if stray:
        raise r.fail("graph", f"output node on {stray[0][0]}, which is not a worker of this plan")


def _check_codecs(r: _Reader, graph: nx.DiGraph, buckets: dict[str, Bucket]) -> None:
    """Every payload is decoded with the codec that encoded it; a bucket uses its own codec (and identity
    for one-way PS pulls); error feedback is on exactly for the bucket codec's encodes when the bucket has it."""
    for node, a in graph.nodes(data=True):
        where = f"graph node {node!r}"
        bucket = buckets[a["tensor"]]
        if "codec" in a and a["codec"] not in (str(bucket.codec), "none"):
            raise r.fail(f"{where}.codec", f"bucket {bucket.name!r} uses codec {str(bucket.codec)!r}, "
                                           f"got {a['codec']!r}")
        if a["op"] in ("send", "decode"):
            (source,) = graph.predecessors(node)
            if graph.nodes[source].get("codec") != a["codec"]:
                raise r.fail(f"{where}.codec", f"{a['codec']!r} does not match the codec of its input {source!r}")
        if a["op"] == "encode":
            expected = bucket.uses_error_feedback and a["codec"] == str(bucket.codec)
            if a["ef"] != expected:
                raise r.fail(f"{where}.ef", f"expected {str(expected).lower()} for bucket {bucket.name!r} "
                                            f"(codec {str(bucket.codec)!r}, error_feedback={bucket.error_feedback})")


def plan_from_dict(data: Any, source: str = "plan") -> SyncPlan:
    """Rebuild a plan from :func:`plan_to_dict` output, validating everything (see the module docstring)."""
    r = _Reader(source)
    if not isinstance(data, dict):
        raise r.fail("top level", f"expected a JSON object, got {type(data).__name__}")
    fmt = data.get("format")
    if fmt != PLAN_FORMAT:
        raise r.fail("format", f"expected {PLAN_FORMAT!r}, got {fmt!r} (not a casync plan file)")
    version = data.get("version")
    if version != PLAN_VERSION:
        raise r.fail("version", f"unsupported plan version {version!r} (this casync reads version {PLAN_VERSION})")
    workers = r.field(data, "workers", "", _POS)
    compact = r.field(data, "compact", "", _BOOL)
    options = r.mapping(data, "options", "")
    if options.get("workers", workers) != workers:
        raise r.fail("options.workers", f"{options['workers']!r} disagrees with workers={workers}")
    mode = options.get("nonfinite", "raise")
    if mode not in NONFINITE_MODES:
        raise r.fail("options.nonfinite", f"expected one of {list(NONFINITE_MODES)}, got {mode!r}")
    if not _NONNEG[0](options.get("seed", 0)):
        raise r.fail("options.seed", f"expected an int >= 0, got {options.get('seed')!r}")
    codecs = {}
    for key, spec in r.mapping(data, "codecs", "").items():
        codec = r.codec(spec, f"codecs[{key!r}]")
        if str(codec) != key:
            raise r.fail(f"codecs[{key!r}]", f"the spec builds codec {str(codec)!r}, not {key!r}")
        codecs[key] = codec
    specs = _read_tensors(r, data)
    buckets = _read_buckets(r, data, specs)
    graph = _read_graph(r, data, workers, buckets, codecs, compact)
    if "codec" in options and isinstance(options["codec"], list) and len(options["codec"]) == 2 \
            and isinstance(options["codec"][0], str) and isinstance(options["codec"][1], dict):
        options = dict(options, codec=tuple(options["codec"]))  # build_plan stores the codec spec as a tuple
    return SyncPlan(graph=graph, tensors=specs, buckets=buckets, workers=workers, codecs=codecs, options=options,
                    compact=compact)


def load_plan(path: str | Path) -> SyncPlan:
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
    return plan_from_dict(data, source=str(path))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a plan file (JSON has no inf/nan)")
