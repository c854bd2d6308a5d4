"""From evaluation curves to the table's numbers: the target, each configuration's time to it, and the speed-ups.

A run's curve is its evaluation points ``{"step", "seconds", "metric"}`` (``seconds``: training time so far, the
evaluation passes left out).  The target is the reference's (DDP allreduce's) metric at its target step (80 % of
its steps), averaged over the seeds; a run reaches it at its first evaluation point whose metric is at least as
good (``>=`` where higher is better, ``<=`` for a loss).  A configuration's time to target is the mean over its
seeds, and only when every seed reaches it: otherwise it says how many did and gets no time.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Sequence

from .configs import FLOOR, REFERENCE, TORCH_HOOKS


def target_step(steps: int, fraction: float = 0.8) -> int:
    """The step whose reference metric is the target: ``fraction`` of the run, at least step 1."""
    return max(1, round(fraction * steps))


def reaches(metric: float | None, target: float, higher_is_better: bool) -> bool:
    if metric is None or not math.isfinite(metric):
        return False
    return metric >= target if higher_is_better else metric <= target


def first_reaching(points: Sequence[dict[str, Any]], target: float, higher_is_better: bool) -> dict[str, Any] | None:
    """The first evaluation point at least as good as ``target``, or None."""
    return next((p for p in points if reaches(p.get("metric"), target, higher_is_better)), None)


def metric_at(points: Sequence[dict[str, Any]], step: int) -> float | None:
    """The metric evaluated at exactly ``step`` (None: no evaluation there, or a non-finite one)."""
    value = next((p.get("metric") for p in points if p["step"] == step), None)
    return value if value is not None and math.isfinite(value) else None


def reference_target(runs: Iterable[dict[str, Any]], step: int) -> float:
    """The mean over the reference's runs of their metric at ``step``; ValueError when a run has none there."""
    runs = list(runs)
    if not runs:
        raise ValueError(f"no {REFERENCE} run to take the target from")
    values = []
    for run in runs:
        value = metric_at(run["points"], step)
        if value is None:
            why = run.get("error") or (f"a non-finite loss at step {run['nonfinite']['step']}" if run.get("nonfinite")
                                       else f"no evaluation at step {step}")
            raise ValueError(f"{REFERENCE}, seed {run['seed']}, has no metric at step {step} ({why}): no target; "
                             "give one with --target")
        values.append(value)
    return statistics.fmean(values)


def time_to_target(runs: Sequence[dict[str, Any]], target: float, higher_is_better: bool) -> dict[str, Any]:
    """``{"seconds", "steps", "reached", "seeds", "per_seed"}``: the mean training seconds and steps to the
    first point reaching ``target`` over the seeds (None unless every seed reaches it), how many seeds did, and
    each seed's point (None where it never did)."""
    per_seed = []
    for run in runs:
        hit = first_reaching(run["points"], target, higher_is_better)
        per_seed.append(None if hit is None else {"seed": run["seed"], "step": hit["step"], "seconds": hit["seconds"]})
    reached = [p for p in per_seed if p is not None]
    every = bool(runs) and len(reached) == len(runs)
    return {"seconds": statistics.fmean(p["seconds"] for p in reached) if every else None,
            "steps": statistics.fmean(p["step"] for p in reached) if every else None,
            "reached": len(reached), "seeds": len(runs), "per_seed": per_seed}


def final_metric(run: dict[str, Any], steps: int) -> float | None:
    """A run's metric at its last step (None if it stopped early, failed, or is not evaluated)."""
    if run.get("error") or run.get("nonfinite"):
        return None
    return metric_at(run["points"], steps)


def _mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(runs: Sequence[dict[str, Any]], configs: Sequence[Any], target: float | None, steps: int,
              higher_is_better: bool) -> list[dict[str, Any]]:
    """One row per configuration (in ``configs``' order; each has ``name``, ``system`` and ``evaluated``): the
    final metric's mean and sd over the seeds, its Δ against the reference's mean, the time to ``target``, the
    speed-ups over the reference and over the fastest PyTorch hook that reaches the target, the wire bytes and
    the training seconds per step, and what went wrong in which seed."""
    rows = []
    for config in configs:
        mine = [r for r in runs if r["config"] == config.name]
        finals = [m for m in (final_metric(r, steps) for r in mine) if m is not None] if config.evaluated else []
        mean, sd = _mean_sd(finals)
        timed = [r["train_seconds"] / r["steps_done"] for r in mine if not r.get("error") and r.get("steps_done")]
        wires = [r["wire_bytes_per_step"] for r in mine if r.get("wire_bytes_per_step") is not None]
        rows.append({"config": config.name, "system": config.system, "evaluated": config.evaluated,
                     "seeds": len(mine), "final_mean": mean, "final_sd": sd, "finals": finals,
                     "time": time_to_target(mine, target, higher_is_better)
                     if config.evaluated and target is not None else None,
                     "step_s": statistics.fmean(timed) if timed else None,
                     "wire_bytes_per_step": statistics.fmean(wires) if wires else None,
                     "problems": [problem(r) for r in mine if problem(r)]})
    by_name = {row["config"]: row for row in rows}
    reference = by_name.get(REFERENCE)
    hooks = [by_name[n] for n in TORCH_HOOKS if n in by_name and _seconds(by_name[n]) is not None]
    fastest = min(hooks, key=_seconds, default=None)
    for row in rows:
        ref_mean = reference["final_mean"] if reference else None
        row["delta"] = row["final_mean"] - ref_mean if row["final_mean"] is not None and ref_mean is not None else None
        row["x_reference"] = _ratio(reference, row)
        row["fastest_hook"] = fastest["config"] if fastest else None
        row["x_fastest_hook"] = _ratio(fastest, row)
    return rows


def _seconds(row: dict[str, Any] | None) -> float | None:
    return row["time"]["seconds"] if row and row.get("time") else None


def _ratio(base: dict[str, Any] | None, row: dict[str, Any]) -> float | None:
    """How many times sooner ``row`` reaches the target than ``base`` (above 1: sooner)."""
    a, b = _seconds(base), _seconds(row)
    return a / b if a is not None and b else None


def problem(run: dict[str, Any]) -> str | None:
    """What went wrong in a run, in a few words (None: nothing)."""
    if run.get("error"):
        return f"seed {run['seed']}: failed: {run['error']}"
    if run.get("nonfinite"):
        bad = run["nonfinite"]
        return (f"seed {run['seed']}: non-finite loss at step {bad['step']} (rank {bad['rank']}); stopped at step "
                f"{run['steps_done']}")
    return None


def sync_share(rows: Sequence[dict[str, Any]]) -> float | None:
    """DDP allreduce's share of its step spent syncing, ``(allreduce step - floor step) / allreduce step`` (the
    floor: the hook without communication), from :func:`summarize`'s rows; None unless both ran."""
    steps = {row["config"]: row["step_s"] for row in rows}
    ref, floor = steps.get(REFERENCE), steps.get(FLOOR)
    return (ref - floor) / ref if ref and floor is not None else None
