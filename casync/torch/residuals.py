"""Error-feedback residuals keyed by parameter names, so checkpoints do not depend on a bucket layout.

Engines key a residual by ``"<role>/<bucket>/<part>"`` (``casync.engines.state``): which partition of which
bucket an encode compresses, and for whom (``worker:3``, or ``server:1`` for a PS server's re-encode).  A DDP
job's buckets are DDP's, which may change between runs; a checkpoint therefore stores, per role, one array per
parameter (its shape), assembled from every partition of that role that covers it.  With the plan the
checkpoint also carries, the conversion back is exact.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from ..plan.syncplan import SyncPlan


def ef_encodes(plan: SyncPlan) -> Iterator[tuple[str, str, str, int, str]]:
    """(key, role, bucket, part, actor) of every encode with error feedback."""
    for _, a in plan.graph.nodes(data=True):
        if a["op"] == "encode" and a["ef"]:
            key = a["ef_key"]
            suffix = f"/{a['bucket']}/{a['part']}"
            yield key, key[: -len(suffix)], a["bucket"], a["part"], a["actor"]


def _overlaps(plan: SyncPlan, bucket: str, part: int) -> Iterator[tuple[Any, int, int, int, int]]:
    """Members of a partition: (member, start in member, stop in member, start in part, stop in part)."""
    b = plan.bucket(bucket)
    start, stop = b.partitions[part]
    for m in b.members:
        lo, hi = max(start, m.offset), min(stop, m.stop)
        if lo < hi:
            yield m, lo - m.offset, hi - m.offset, lo - start, hi - start


def to_named(plan: SyncPlan, residuals: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Plan-keyed residuals -> ``{role: {parameter: flat float32 array}}`` (a role's elements that none of its
    partitions covers are zero; they are never read back)."""
    where = {key: (role, bucket, part) for key, role, bucket, part, _ in ef_encodes(plan)}
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, value in residuals.items():
        if key not in where:
            raise ValueError(f"residual {key!r} belongs to no encode of the plan")
        role, bucket, part = where[key]
        mine = out.setdefault(role, {})
        for m, m0, m1, p0, p1 in _overlaps(plan, bucket, part):
            array = mine.get(m.spec.name)
            if array is None:
                array = mine[m.spec.name] = np.zeros(m.spec.numel, np.float32)
            array[m0:m1] = value[p0:p1]
    return out


def from_named(plan: SyncPlan, named: Mapping[str, Mapping[str, np.ndarray]], actor: str | None = None
               ) -> dict[str, np.ndarray]:
    """The inverse of :func:`to_named` for the encodes of ``actor`` (None: every actor).  Empty ``named``
    (a state saved before its first compressed step) gives no residuals."""
    if not named:
        return {}
    out = {}
    for key, role, bucket, part, owner in ef_encodes(plan):
        if actor is not None and owner != actor:
            continue
        params = named.get(role)
        if params is None:
            raise ValueError(f"the saved residuals have none for {role!r}, which this plan's encodes use "
                             f"(saved roles: {sorted(named)[:6]})")
        start, stop = plan.bucket(bucket).partitions[part]
        value = np.empty(stop - start, np.float32)
        for m, m0, m1, p0, p1 in _overlaps(plan, bucket, part):
            if m.spec.name not in params:
                raise ValueError(f"the saved residuals of {role!r} have no entry for parameter {m.spec.name!r}")
            value[p0:p1] = params[m.spec.name][m0:m1]
        out[key] = value
    return out


def check_named(plan: SyncPlan, named: Any) -> dict[str, dict[str, np.ndarray]]:
    """Validate saved residuals against the plan they were saved with; returns them as flat float32 arrays."""
    if not isinstance(named, Mapping):
        raise TypeError(f"'residuals' must map role -> {{parameter: tensor}}, got {type(named).__name__}")
    shapes = {t.name: t.shape for t in plan.tensors}
    roles = {role for _, role, _, _, _ in ef_encodes(plan)}
    out: dict[str, dict[str, np.ndarray]] = {}
    for role, params in named.items():
        if role not in roles:
            raise ValueError(f"the saved residuals have a role {role!r} that the plan does not use (roles: "
                             f"{sorted(roles)[:6]})")
        if not isinstance(params, Mapping):
            raise TypeError(f"residuals of {role!r} must map parameter -> tensor, got {type(params).__name__}")
        out[role] = {}
        for name, value in params.items():
            if name not in shapes:
                raise ValueError(f"the saved residuals of {role!r} name a parameter {name!r} that the plan does not "
                                 "sync")
            array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
            if array.dtype != np.float32 or tuple(array.shape) not in (shapes[name], (int(np.prod(shapes[name])),)):
                raise ValueError(f"residual of {role!r} for {name!r}: expected float32 of shape {shapes[name]}, got "
                                 f"{array.dtype} {tuple(array.shape)}")
            if not np.isfinite(array).all():
                raise ValueError(f"residual of {role!r} for {name!r} holds NaN or Inf; error-feedback state must be "
                                 "finite")
            out[role][name] = np.array(array, np.float32, copy=True).reshape(-1)
    if out:
        from_named(plan, out)  # every encode's residual can be rebuilt
    return out
