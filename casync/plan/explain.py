"""Where did my tensor go: what a plan does with one tensor (or bucket), in words.

:func:`explain` backs ``SyncPlan.explain(name)``: the tensor's bucket and its place there, the bucket's
strategy, codec, error feedback, partitions (and which of them hold the tensor), bytes on the wire, and
why — the planner's note for planned buckets, the caller's arguments for fixed ones.  :func:`members_label`
is the "tensors" column of ``SyncPlan.summary()``.
"""
from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from casync.primitives import feedback
from casync.primitives.codecs import get_codec
from casync.strategies import get_strategy

from ..table import human_bytes

if TYPE_CHECKING:
    from .specs import Bucket
    from .syncplan import SyncPlan

#: longest tensor name shown in full in the summary's "tensors" column
NAME_WIDTH = 28


def _short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else "…" + name[-(NAME_WIDTH - 1):]


def members_label(bucket: Bucket) -> str:
    """``"1: fc.weight"`` or ``"13: fc.bias … layer4.2.bn3.weight"`` (count, first and last, in bucket order)."""
    names = bucket.tensor_names
    if len(names) == 1:
        return f"1: {_short(names[0])}"
    return f"{len(names)}: {_short(names[0])} … {_short(names[-1])}"


def _find(plan: SyncPlan, name: str) -> tuple[Bucket, list[str]]:
    """The bucket ``name`` names (a tensor's or a bucket's own name) and the tensors it concerns."""
    if not isinstance(name, str):
        raise TypeError(f"explain needs a tensor or bucket name (str), got {type(name).__name__}")
    for b in plan.buckets:
        if b.name == name and not any(m.spec.name == name for m in b.members):
            return b, b.tensor_names
    try:
        bucket, _ = plan.locate(name)
    except KeyError:
        known = [t.name for t in plan.tensors] + [b.name for b in plan.buckets]
        close = difflib.get_close_matches(name, list(dict.fromkeys(known)), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise KeyError(f"no tensor or bucket named {name!r} in the plan{hint}") from None
    return bucket, [name]


def _option(key: str, value: object) -> str:
    if key == "codec" and isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], dict):
        value = str(get_codec(tuple(value)))
    return f"{key}={value!r}" if not isinstance(value, str) or key != "codec" else f"{key}={value}"


def _reason(plan: SyncPlan, bucket: Bucket) -> str:
    planner = plan.options.get("planner")
    if planner is None:
        args = ", ".join(_option(k, plan.options[k]) for k in ("strategy", "codec", "partitions", "two_way",
                                                                "servers") if k in plan.options)
        return f"chosen by the caller ({args})" + (f"; {bucket.note}" if bucket.note else "")
    return f"planner: {bucket.note or 'no note'} (winning candidate: {planner.get('chosen', '?')})"


EF_WORDS = {"off": "without error feedback", "plain": "with error feedback",
            "contractive": "with error feedback on its contractive version (scale x 1/(1+omega))"}


def explain(plan: SyncPlan, name: str) -> str:
    """What ``plan`` does with tensor (or bucket) ``name``: several lines of text."""
    bucket, tensors = _find(plan, name)
    strategy = get_strategy(bucket.strategy).label(bucket)
    parts = bucket.partitions
    ef = feedback.kind(bucket.codec, bucket.uses_error_feedback)
    wire = plan.wire_bytes(bucket.name)
    lines = []
    if tensors == [name] and name in {m.spec.name for m in bucket.members}:
        member = next(m for m in bucket.members if m.spec.name == name)
        shape = "x".join(map(str, member.spec.shape)) or "scalar"
        held = [i for i, (start, stop) in enumerate(parts) if start < member.stop and member.offset < stop]
        where = (f"partition {held[0]}" if len(held) == 1 else f"partitions {held[0]}–{held[-1]}") if held else \
            "no partition (empty)"
        lines.append(f"tensor {name}: {member.spec.numel:,} elements ({shape}), {human_bytes(member.spec.nbytes)}")
        lines.append(f"  bucket      {bucket.name} (priority {bucket.priority}; {members_label(bucket)}), elements "
                     f"[{member.offset:,}, {member.stop:,}) of {bucket.numel:,}, in {where}")
        share = wire * member.spec.numel / bucket.numel if bucket.numel else 0
    else:
        lines.append(f"bucket {bucket.name}: {bucket.numel:,} elements, {members_label(bucket)}")
        share = wire
    lines.append(f"  strategy    {strategy}")
    lines.append(f"  codec       {bucket.codec}" + ("" if bucket.codec.lossless else f", {EF_WORDS[ef]}"))
    sizes = sorted({stop - start for start, stop in parts})
    lines.append(f"  partitions  {len(parts)} of {'/'.join(f'{s:,}' for s in sizes)} elements")
    ratio = (4 * bucket.numel * _dense_sends(plan, bucket) / wire) if wire else 0.0
    lines.append(f"  wire        {human_bytes(wire)} per iteration for the bucket"
                 + (f" (about {human_bytes(share)} for this tensor)" if share != wire else "")
                 + (f", {ratio:.1f}x less than uncompressed" if ratio and not bucket.codec.lossless else ""))
    lines.append(f"  why         {_reason(plan, bucket)}")
    return "\n".join(lines)


def _dense_sends(plan: SyncPlan, bucket: Bucket) -> float:
    """How many bucket-sized float32 copies the bucket's sends would move uncompressed."""
    numel = {}
    for _, a in plan.graph.nodes(data=True):
        if a["op"] == "send" and a["bucket"] == bucket.name:
            numel[a["part"]] = numel.get(a["part"], 0) + a["numel"]
    return sum(numel.values()) / bucket.numel if bucket.numel else 0.0
