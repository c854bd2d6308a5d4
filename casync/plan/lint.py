"""``lint(plan)``: check a plan against the rules of the IR, as ``torch.fx.Graph.lint`` does for its graphs.

Every node carries the attributes ``casync.primitives.ir`` lists for its primitive, with values of the right
type; it belongs to a bucket and partition of the plan; data crosses actors only through a send -> recv
pair of the same codec and size; merges take their inputs in consecutive slots; every worker has exactly
one output node per partition; every payload is decoded with the codec that encoded it; error feedback
is on exactly where the bucket's codec is lossy and the bucket has it.  ``assemble_plan`` runs it on
every plan it builds and ``SyncPlan.load`` on every plan it reads, so a broken strategy or a hand-edited
file fails here, naming the node, instead of in an engine.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from casync.primitives.ir import COMMON_ATTRS, NODE_ATTRS, OPS, OPTIONAL_ATTRS, Actor

from ..errors import PlanError

if TYPE_CHECKING:
    from .syncplan import SyncPlan

_SCALARS = (bool, int, float, str, type(None))


def _fail(where: str, message: str) -> PlanError:
    return PlanError(f"{where}: {message}"[:400])


def check_node_attrs(node: str, attrs: dict[str, Any], workers: int) -> None:
    """The attributes of one node: present, of the right type, plain scalars; actors well named."""
    where = f"graph node {node!r}"
    op = attrs.get("op")
    if not isinstance(op, str) or op not in NODE_ATTRS:
        raise _fail(f"{where}.op", f"expected one of {list(OPS)}, got {op!r}")
    for table in (COMMON_ATTRS, NODE_ATTRS[op]):
        for key, spec in table.items():
            if key not in attrs:
                raise _fail(f"{where}.{key}", "missing")
            if not spec.check(attrs[key]):
                raise _fail(f"{where}.{key}", f"expected {spec.what}, got {attrs[key]!r}")
    for key, spec in OPTIONAL_ATTRS.items():
        if key in attrs and not spec.check(attrs[key]):
            raise _fail(f"{where}.{key}", f"expected {spec.what}, got {attrs[key]!r}")
    for key, value in attrs.items():
        if not isinstance(value, _SCALARS):
            raise _fail(f"{where}.{key}", f"node attributes must be plain scalars, got {value!r}")
    for key in ("actor", "peer"):
        if key in attrs:
            _check_actor(attrs[key], workers, f"{where}.{key}")
    if attrs.get("local_input") and not Actor.parse(attrs["actor"]).is_worker:
        raise _fail(f"{where}.local_input", f"only workers have local gradients, not {attrs['actor']!r}")
    if op == "encode" and attrs["ef"] and attrs["ef_key"] is None:
        raise _fail(f"{where}.ef_key", "an encode with error feedback needs an ef_key")


def _check_actor(name: Any, workers: int, where: str) -> None:
    try:
        actor = Actor.parse(name)
    except ValueError:
        actor = None
    if actor is None or (actor.is_worker and actor.index >= workers):
        raise _fail(where, f"expected 'worker:<0..{workers - 1}>' or 'server:<i>', got {name!r}")


def lint(plan: SyncPlan, attrs: bool = True) -> None:
    """Raise :class:`~casync.errors.PlanError` naming the first node or field that breaks the IR's rules.

    ``attrs=False`` skips the per-attribute type checks (the builder's own nodes are typed by construction;
    structure, codecs and outputs are still checked).  About 3 us per op."""
    graph, workers, compact = plan.graph, plan.workers, plan.compact
    buckets = {b.name: b for b in plan.buckets}
    if len(buckets) != len(plan.buckets):
        raise _fail("buckets", "bucket names must be unique")
    codec_of = {b.name: str(b.codec) for b in plan.buckets}
    sizes = {b.name: [stop - start for start, stop in b.partitions] for b in plan.buckets}
    ef_keys: Counter[str] = Counter()
    outputs: Counter[tuple[str, str, int]] = Counter()
    pred, succ, nodes = graph._pred, graph._succ, graph._node
    # what depends only on (bucket, part, numel, codec) or (bucket, codec) is checked once per distinct value:
    # a plan has hundreds of thousands of nodes and few such combinations
    placed: set[tuple] = set()
    ef_of: dict[tuple[str, Any], bool] = {}
    votes = {b.name: b.codec.votes for b in plan.buckets}
    for node, a in nodes.items():
        if attrs:
            check_node_attrs(node, a, workers)
        name = a.get("bucket")
        codec = a.get("codec")
        place = (name, a.get("part"), a.get("numel"), codec)
        if place not in placed:
            _check_place(node, a, name, codec, sizes, codec_of, plan.codecs)
            placed.add(place)
        part = a["part"]
        op = a["op"]
        inputs = pred[node]
        if op == "merge":
            _check_merge(node, a, inputs)
        elif op == "encode":
            local = a["local_input"]
            if len(inputs) != (0 if local else 1):
                raise _fail(f"graph node {node!r}", f"an encode {'of the local gradient ' if local else ''}takes "
                                                    f"{0 if local else 1} input(s), has {len(inputs)}")
            expected_ef = ef_of.get((name, codec))
            if expected_ef is None:
                expected_ef = ef_of[(name, codec)] = buckets[name].uses_error_feedback and codec == codec_of[name]
            if a["ef"] != expected_ef:
                bucket = buckets[name]
                raise _fail(f"graph node {node!r}.ef", f"expected {str(expected_ef).lower()} for bucket {name!r} "
                                                       f"(codec {codec_of[name]!r}, error_feedback={bucket.error_feedback})")
            if expected_ef:
                ef_keys[a["ef_key"]] += 1
                c = plan.codecs[codec]
                if not c.ef_sound and not c.has_contractive:
                    raise _fail(f"graph node {node!r}.ef", f"codec {codec!r} is not sound for error feedback "
                                                           "(ef_sound) and has no contractive version")
        elif len(inputs) != 1:
            raise _fail(f"graph node {node!r}", f"a {op} takes exactly one input, has {len(inputs)}")
        actor = a["actor"]
        for u in inputs:
            ua = nodes[u]
            if ua["bucket"] != name or ua["part"] != part:
                raise _fail(f"graph node {node!r}", f"input {u!r} belongs to another bucket/partition")
            if ua["actor"] != actor and not (op == "recv" and ua["op"] == "send"):
                raise _fail(f"graph node {node!r}", f"data from {u!r} crosses actors outside a send -> recv pair")
            if (op == "send" or op == "decode") and ua.get("codec") != codec:
                raise _fail(f"graph node {node!r}.codec", f"{codec!r} does not match the codec of its input {u!r}")
        if op == "recv":
            (send,) = inputs
            sa = nodes[send]
            if sa["op"] != "send" or sa["codec"] != codec or sa["nbytes"] != a["nbytes"]:
                raise _fail(f"graph node {node!r}", f"must receive from a send of the same codec and size, got {send!r}")
            if not compact and (sa["peer"] != actor or a["peer"] != sa["actor"]):
                raise _fail(f"graph node {node!r}", f"peer mismatch with {send!r}")
        elif op == "send":
            out = succ[node]
            if len(out) != 1 or nodes[next(iter(out))]["op"] != "recv":
                raise _fail(f"graph node {node!r}", f"a send feeds exactly one recv, feeds {list(out)[:3]}")
        if a.get("output"):
            outputs[(actor, name, part)] += 1
            if votes.get(name):
                _check_vote(node, plan, buckets[name])
    twice = [k for k, c in ef_keys.items() if c > 1]
    if twice and not compact:  # a template reuses one worker's keys for its symmetric hops
        raise _fail("graph", f"error-feedback key {twice[0]!r} is used by several encodes")
    _check_outputs(outputs, sizes, workers, compact)
    _check_acyclic(pred, succ)


def _check_place(node: str, a: dict[str, Any], name: Any, codec: Any, sizes: dict[str, list[int]],
                 codec_of: dict[str, str], codecs: dict[str, Any]) -> None:
    """A node's bucket, partition, size and codec agree with the plan's buckets and codecs."""
    parts = sizes.get(name)
    if parts is None:
        raise _fail(f"graph node {node!r}.bucket", f"no bucket named {name!r}")
    part = a["part"]
    if part >= len(parts):
        raise _fail(f"graph node {node!r}.part", f"bucket {name!r} has {len(parts)} partition(s), got {part}")
    if a["numel"] != parts[part]:
        raise _fail(f"graph node {node!r}.numel", f"partition {part} of {name!r} has {parts[part]} elements, "
                                                  f"got {a['numel']}")
    if codec is not None and codec not in codecs:
        raise _fail(f"graph node {node!r}.codec", f"codec {codec!r} is not in 'codecs'")
    if codec is not None and codec != codec_of[name] and codec != "none":
        raise _fail(f"graph node {node!r}.codec", f"bucket {name!r} uses codec {codec_of[name]!r}, got {codec!r}")


def _check_merge(node: str, a: dict[str, Any], inputs: dict[str, dict]) -> None:
    local = a["local_input"]
    total = len(inputs) + local
    if local and not (a["local_slot"] is not None and a["local_slot"] < total):
        raise _fail(f"graph node {node!r}.local_slot", f"must be < {total} for a merge of {total} inputs")
    slots = sorted(d["slot"] for d in inputs.values())
    expected = [s for s in range(total) if not (local and s == a["local_slot"])]
    if slots != expected:
        raise _fail(f"graph node {node!r}", f"merge input slots {slots} do not match {expected}")


def _check_outputs(outputs: Counter, sizes: dict[str, list[int]], workers: int, compact: bool) -> None:
    """Exactly one output node per worker, bucket and partition (templates: representative worker only)."""
    owners = [f"worker:{w}" for w in range(1 if compact else workers)]
    for name, parts in ({} if compact else sizes).items():  # templates cover representative partitions only
        for actor in owners:
            for part in range(len(parts)):
                count = outputs.get((actor, name, part), 0)
                if count != 1:
                    raise _fail("graph", f"{actor} has {count} output nodes for bucket {name!r} partition {part} "
                                         "(expected exactly one)")
    stray = [k for k in outputs if k[0] not in owners]
    if stray:
        raise _fail("graph", f"output node on {stray[0][0]}, which is not a worker of this plan")


def _check_vote(output: str, plan: SyncPlan, bucket: Any) -> None:
    """An output of a bucket whose codec votes (``Codec.votes``, signSGD) holds the vote of all workers' signs: it
    decodes the codec's encode of a merge of every worker's encoded local gradient and nothing else (the merge's
    mean of signs, whose sign the encode takes), or, with one worker, of its own gradient."""
    nodes, pred, workers, codec = plan.graph._node, plan.graph._pred, plan.workers, str(bucket.codec)

    def source(node: str) -> str | None:  # the encode with the codec that a decode's payload comes from
        while nodes[node]["op"] in ("decode", "recv", "send"):
            if len(pred[node]) != 1:
                return None
            (node,) = pred[node]
        return node if nodes[node]["op"] == "encode" and nodes[node]["codec"] == codec else None

    def signs_of_all(merge: str) -> bool:  # the merge adds every worker's encoded signs and nothing else
        a = nodes[merge]
        if a["op"] != "merge" or len(pred[merge]) + a["local_input"] != workers or (a["local_input"] and workers > 1):
            return False
        for d in pred[merge]:
            enc = source(d) if nodes[d]["op"] == "decode" and nodes[d]["codec"] == codec else None
            if enc is None or not nodes[enc]["local_input"]:
                return False
        return True

    a = nodes[output]
    enc = source(output) if a["op"] == "decode" and a["codec"] == codec else None
    if a["op"] == "merge":
        exact = workers == 1 and signs_of_all(output)
    elif enc is None:
        exact = False
    elif nodes[enc]["local_input"]:
        exact = workers == 1
    else:
        exact = len(pred[enc]) == 1 and signs_of_all(next(iter(pred[enc])))
    if not exact:
        where = f"strategy {bucket.strategy!r}" + (f" (two_way={bucket.two_way}, servers={bucket.servers})"
                                                   if bucket.strategy == "ps" else "")
        raise PlanError(f"bucket {bucket.name!r}: codec {codec!r} aggregates by majority vote, which {where} does not "
                        f"compute exactly: {a['actor']}'s output is not the vote of all {workers} workers' signs (a "
                        "vote of partial votes, or of a raw gradient, is not the vote of all); use strategy='ps' "
                        "with dedicated servers (servers=S) and two_way=True")


def _check_acyclic(pred: dict[str, dict], succ: dict[str, dict]) -> None:
    indeg = {n: len(p) for n, p in pred.items()}
    ready = [n for n, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if seen != len(indeg):
        raise _fail("graph", "has a cycle")
