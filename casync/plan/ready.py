"""When gradients become ready: a plausible backward-pass profile, and each bucket's ready time.

The simulator and the planner both take ``ready_times`` (tensor or bucket name -> seconds): a bucket is
ready when its last member is.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from .specs import TensorSpec
from .tensors import tensor_specs


def backward_ready_times(tensors: Any, total_backward_s: float, start_s: float = 0.0) -> dict[str, float]:
    """When each gradient becomes ready in a backward pass of ``total_backward_s`` seconds.

    ``tensors`` is anything :func:`casync.build_plan` accepts (a built-in model name, a torch module, a
    mapping or list of shapes), taken in backward order.  Gradients become ready one after the other in
    that order and the backward time is shared out in proportion to parameter count (a FLOP proxy: a
    layer's weight-gradient GEMM scales with its weight size), so tensor ``i`` is ready at
    ``start_s + total_backward_s * (params of tensors 0..i) / (all params)``; the last gradient is ready at
    ``start_s + total_backward_s``.  Returns ``{tensor name: seconds}`` for ``ready_times=``.
    """
    if isinstance(total_backward_s, bool) or not isinstance(total_backward_s, (int, float)) \
            or not math.isfinite(total_backward_s) or total_backward_s < 0:
        raise ValueError(f"total_backward_s must be a non-negative number of seconds, got {total_backward_s!r}")
    if isinstance(start_s, bool) or not isinstance(start_s, (int, float)) or not math.isfinite(start_s) \
            or start_s < 0:
        raise ValueError(f"start_s must be a non-negative number of seconds, got {start_s!r}")
    specs = tensor_specs(tensors)
    total = sum(s.numel for s in specs)
    out, acc = {}, 0
    for i, spec in enumerate(specs):
        acc += spec.numel
        share = acc / total if total else (i + 1) / len(specs)
        out[spec.name] = float(start_s + total_backward_s * share)
    return out


def bucket_ready_times(groups: Sequence[tuple[str, Sequence[TensorSpec]]], ready_times: Mapping[str, float] | None,
                       specs: Sequence[TensorSpec]) -> list[float]:
    """Each bucket's ready time (0 where nothing is known); unknown names and bad values are errors."""
    if not ready_times:
        return [0.0] * len(groups)
    if not isinstance(ready_times, Mapping):
        raise TypeError("ready_times must be a mapping tensor name -> seconds")
    known = {s.name for s in specs} | {name for name, _ in groups}
    unknown = set(ready_times) - known
    if unknown:
        raise ValueError(f"ready_times names unknown tensors: {sorted(unknown)[:5]}")
    for name, t in ready_times.items():
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"ready_times[{name!r}] must be a non-negative number of seconds, got {t!r}")
    out = []
    for name, group in groups:
        times = [ready_times[s.name] for s in group if s.name in ready_times]
        if name in ready_times:
            times.append(ready_times[name])
        out.append(float(max(times)) if times else 0.0)
    return out
