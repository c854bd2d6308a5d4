"""How good the bench's model was: the distance of each casync row's prediction from its measurement and how well
the predictions rank the rows (Spearman), for the report's header.

The planner chooses by ranking candidates, so the rank correlation says whether ``auto`` could have chosen well;
the median and worst |predicted/measured − 1| say whether a "predicted" cell can be read as a time.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Sequence

import numpy as np

#: fewer rows than this make neither a median error nor a rank correlation worth printing
MIN_ROWS = 3


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks of ``values``, tied values sharing the mean of the ranks they span (``[10, 20, 20]`` ->
    ``[1, 2.5, 2.5]``), as Spearman's coefficient needs."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError(f"ranks need a flat sequence of finite numbers, got {values!r}")
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=float)
    sorted_x = x[order]
    start = 0
    while start < len(x):
        end = start
        while end + 1 < len(x) and sorted_x[end + 1] == sorted_x[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1  # ranks start+1 .. end+1, averaged
        start = end + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of paired samples: Pearson's correlation of their average ranks (the same as
    ``scipy.stats.spearmanr``, without depending on SciPy).  Refused where it is undefined: under two pairs, or
    one side all equal."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs paired samples, got {len(x)} and {len(y)} values")
    if len(x) < 2:
        raise ValueError(f"spearman needs at least 2 pairs, got {len(x)}")
    rx, ry = average_ranks(x), average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    norm = math.sqrt(float(np.dot(dx, dx)) * float(np.dot(dy, dy)))
    if norm == 0:
        raise ValueError("spearman is undefined when one side's values are all equal")
    return float(np.dot(dx, dy)) / norm


def _qualifies(row: Any) -> bool:
    """A casync row (RayEngine or through DDP's hook) that ran and has a positive finite prediction."""
    pred = row.predicted_s
    return (row.system in ("casync", "hook") and row.ok and row.sync_s > 0 and pred is not None
            and math.isfinite(pred) and pred > 0)


def row_name(row: Any) -> str:
    return f"{row.model} N={row.workers} {row.label}"


def model_fidelity(rows: Iterable[Any]) -> dict[str, Any]:
    """Over the casync and hook rows with both a prediction and a measurement: ``rows`` (how many),
    ``median_error`` and ``worst_error`` (|predicted/measured − 1|), ``worst_row``, ``spearman`` (predicted
    against measured times); every statistic None, and ``reason`` saying why, under :data:`MIN_ROWS` rows
    (``spearman`` alone None where one side's times are all equal)."""
    used = [r for r in rows if _qualifies(r)]
    out: dict[str, Any] = {"rows": len(used), "median_error": None, "worst_error": None, "worst_row": None,
                           "spearman": None, "reason": None}
    if len(used) < MIN_ROWS:
        out["reason"] = (f"{len(used)} casync row{'s' if len(used) != 1 else ''} with a prediction and a "
                         f"measurement; at least {MIN_ROWS} needed")
        return out
    errors = [abs(r.predicted_s / r.sync_s - 1) for r in used]
    worst = max(range(len(used)), key=errors.__getitem__)
    out.update(median_error=statistics.median(errors), worst_error=errors[worst], worst_row=row_name(used[worst]))
    try:
        out["spearman"] = spearman([r.predicted_s for r in used], [r.sync_s for r in used])
    except ValueError as exc:
        out["reason"] = f"rank correlation undefined: {exc}"
    return out


def fidelity_by_group(rows: Sequence[Any]) -> dict[str, Any]:
    """:func:`model_fidelity` over all rows (``all``) and, where the run has several (model, workers) groups, per
    group (``"model/N"``): a ranking across models mostly says that larger models take longer."""
    out = {"all": model_fidelity(rows)}
    groups = list(dict.fromkeys((r.model, r.workers) for r in rows))
    if len(groups) > 1:
        for model, workers in groups:
            out[f"{model}/{workers}"] = model_fidelity(r for r in rows if (r.model, r.workers) == (model, workers))
    return out


def fidelity_text(fidelity: dict[str, Any]) -> str:
    """One sentence for a report header: the median and worst error (naming the row) and the rank correlation,
    or n/a with the reason."""
    n = fidelity["rows"]
    if fidelity["median_error"] is None:
        return f"n/a ({fidelity['reason']})"
    rho = (f"{fidelity['spearman']:.2f}" if fidelity["spearman"] is not None else f"n/a ({fidelity['reason']})")
    return (f"over {n} casync rows: |predicted/measured − 1| median {fidelity['median_error']:.2f}, worst "
            f"{fidelity['worst_error']:.2f} ({fidelity['worst_row']}); Spearman rank correlation of predicted and "
            f"measured times {rho}")


def fidelity_lines(by_group: dict[str, Any]) -> list[str]:
    """The header's lines: the run's figures, then each group's where there are several."""
    lines = [f"Model fidelity {fidelity_text(by_group['all'])}."]
    lines += [f"- {key}: {fidelity_text(f)}." for key, f in by_group.items() if key != "all"]
    return lines
