"""Learning-rate schedules of the tasks' training runs: the factor on the base rate at each step.

``constant`` keeps the tuned rate; ``cosine`` anneals it from the base rate towards 0 over the run (step s of S,
1-based, trains at ``lr * (1 + cos(pi * (s - 1) / S)) / 2``), as most real training does: late steps are small,
so a run's final metric is not one noisy iterate, and error feedback's residual, which scales with the step,
shrinks with it.
"""
from __future__ import annotations

import math
from typing import Callable

SCHEDULES = ("constant", "cosine")


def check_schedule(name: str) -> str:
    if name not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    return name


def lr_factor(name: str, steps: int) -> Callable[[int], float]:
    """``factor(k)``: the base rate's multiplier for the step after ``k`` steps were taken (torch's ``LambdaLR``
    counts ``k`` from 0), for a run of ``steps`` steps."""
    check_schedule(name)
    if name == "constant":
        return lambda k: 1.0
    return lambda k: 0.5 * (1.0 + math.cos(math.pi * min(k, steps) / steps))
