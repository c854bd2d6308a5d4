"""What ``casync.torch.OneBitAdam`` refuses, with errors that say what was expected: checked before any sync."""
from __future__ import annotations

from typing import Any

import torch

from casync.primitives import feedback
from casync.primitives.codecs import get_codec

from ..plan.syncplan import SyncPlan
from .plans import SyncOptions


def check_warmup_steps(value: Any) -> int:
    """``warmup_steps`` as an int >= 1 (the variance is frozen at its warm-up value: with no warm-up it would be
    zero, and every update ``m/eps``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"warmup_steps must be an int (full-precision Adam steps before the variance is frozen), "
                        f"got {value!r}")
    if value < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {value}: the variance is frozen at its warm-up value, and "
                         "with no warm-up it would be zero (every update m/eps)")
    return value


def check_compressible(options: SyncOptions) -> None:
    """A fixed lossy codec must keep error-feedback residuals: 1-bit Adam's convergence rests on them."""
    if options.planned:
        return  # the planner's choice is checked on the plan (check_plan_feedback)
    codec = get_codec(None if options.codec == "none" else options.codec)
    if not codec.lossless and not feedback.resolve(codec, options.error_feedback):
        raise ValueError(f"codec {str(codec)!r} with error_feedback={options.error_feedback!r} keeps no "
                         "error-feedback residuals; OneBitAdam compresses the momentum with error feedback at the "
                         "worker and at the server: use error_feedback='auto' or True with a codec that supports it "
                         "(onebit, topk, ...), or codec='none'")


def check_plan_feedback(plan: SyncPlan) -> None:
    """Every bucket the plan compresses lossily keeps error-feedback residuals, and it syncs the mean."""
    if plan.options.get("op", "mean") != "mean":
        raise ValueError(f"OneBitAdam syncs the mean of the ranks' momenta; the plan's op is {plan.options['op']!r}")
    bare = [f"{b.name} ({b.codec})" for b in plan.buckets if not b.codec.lossless and not b.uses_error_feedback]
    if bare:
        raise ValueError(f"the plan compresses buckets {bare[:4]} without error feedback; OneBitAdam needs it at "
                         "both ends (error_feedback='auto' or True)")


def named_groups(param_groups: list[dict[str, Any]]) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) of every group, in order: named (``model.named_parameters()``), unique, float32 and dense."""
    named: list[tuple[str, torch.Tensor]] = []
    for index, group in enumerate(param_groups):
        names = group.get("param_names")
        if names is None:
            raise TypeError(f"parameter group {index} has unnamed parameters: pass model.named_parameters() (or groups "
                            "of named parameters); the names key casync's plan and its checkpointed residuals")
        named.extend(zip(names, group["params"]))
    seen: dict[str, int] = {}
    for name, p in named:
        seen[name] = seen.get(name, 0) + 1
        if p.dtype != torch.float32:
            raise TypeError(f"parameter {name!r} is {p.dtype}; OneBitAdam keeps float32 parameters and moments (keep "
                            "float32 master weights under mixed precision)")
        if p.layout != torch.strided:
            raise TypeError(f"parameter {name!r} is {p.layout}; OneBitAdam updates dense parameters only")
    doubled = sorted(n for n, c in seen.items() if c > 1)
    if doubled:
        raise ValueError(f"parameter names {doubled[:4]} appear more than once (groups from several modules' "
                         "named_parameters()? prefix them with the module's name)")
    return named
