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


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of paired samples (``scipy.stats.spearmanr``: tied values share their mean
    rank).  Refused where it is undefined, instead of SciPy's NaN and warning: under two pairs, one side all equal,
    or a value that is not finite."""
    from scipy import stats

    if len(x) != len(y):
        raise ValueError(f"spearman needs paired samples, got {len(x)} and {len(y)} values")
    if len(x) < 2:
        raise ValueError(f"spearman needs at least 2 pairs, got {len(x)}")
    for side in (x, y):
        values = np.asarray(side, dtype=float)
        if not np.all(np.isfinite(values)):
            raise ValueError(f"spearman needs finite numbers, got {list(side)!r}")
        if np.all(values == values[0]):
            raise ValueError("spearman is undefined when one side's values are all equal")
    return float(stats.spearmanr(x, y).statistic)


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
