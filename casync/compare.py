"""Strategy comparison: run the same gradients through several (strategy, codec) plans and tabulate.

Reports, per configuration: bytes on the wire, compression ratio, sync time, the error against the
exact mean, and whether every worker ended with bit-identical results.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import numpy as np

from .build import build_plan
from .engine_local import LocalEngine
from .plan import SyncPlan

QUICK_STRATEGIES = ("ps", "ring", "allgather")
QUICK_CODECS = ("none", "fp16", "onebit", "topk:ratio=0.01")


@dataclass
class CompareRow:
    """One measured configuration."""

    model: str
    workers: int
    strategy: str
    codec: str
    wire_bytes: int
    compression: float
    sync_s: float
    rel_error: float
    consistent: bool
    ops: int


def random_grads(plan: SyncPlan, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Gaussian gradients per worker, shaped like the plan's tensors (a stand-in for a backward pass)."""
    rng = np.random.default_rng(seed)
    return [{t.name: rng.standard_normal(t.shape, dtype=np.float32) for t in plan.tensors}
            for _ in range(plan.workers)]


def _engine_factory(engine: str, address: str | None) -> Callable[[SyncPlan], Any]:
    if engine == "local":
        return LocalEngine
    if engine == "ray":
        from .runtime.ray_engine import RayEngine  # noqa: WPS433 (optional: only when asked for)

        return lambda plan: RayEngine(plan, address=address)
    raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")


def compare(model: Any, workers: int = 4, strategies: Iterable[str] = QUICK_STRATEGIES,
            codecs: Iterable[str] = QUICK_CODECS, steps: int = 2, engine: str = "local",
            address: str | None = None, progress: bool = True, seed: int = 0) -> list[CompareRow]:
    """Measure every (strategy, codec) on ``model``'s gradient shapes with ``workers`` workers."""
    from tqdm.auto import tqdm

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    make_engine = _engine_factory(engine, address)
    configs = [(s, c) for s in strategies for c in codecs]
    rows = []
    grads = None
    for strategy, codec in tqdm(configs, desc="configurations", disable=not progress):
        plan = build_plan(model, workers=workers, strategy=strategy, codec=codec, seed=seed)
        if grads is None:
            grads = random_grads(plan, seed)
            exact = {t.name: np.mean([g[t.name] for g in grads], axis=0, dtype=np.float64) for t in plan.tensors}
            norm = np.sqrt(sum(float(np.sum(v * v)) for v in exact.values()))
        eng = make_engine(plan)
        try:
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                out = eng.sync(grads)
                times.append(time.perf_counter() - t0)
        finally:
            if hasattr(eng, "close"):
                eng.close()
        err = np.sqrt(sum(float(np.sum((out[0][k] - v) ** 2)) for k, v in exact.items()))
        consistent = all(np.array_equal(out[0][k], o[k]) for o in out[1:] for k in exact)
        # the same sends uncompressed (4 bytes an element), for the ratio
        plain = sum(4 * a["numel"] for _, a in plan.graph.nodes(data=True) if a["op"] == "send")
        wire = plan.wire_bytes()
        rows.append(CompareRow(model=str(model), workers=workers, strategy=strategy, codec=codec,
                               wire_bytes=wire, compression=plain / wire if wire else 1.0,
                               sync_s=float(np.median(times)), rel_error=err / norm if norm else 0.0,
                               consistent=consistent, ops=plan.graph.number_of_nodes()))
    return rows


def rows_table(rows: list[CompareRow]) -> tuple[list[str], list[list[Any]]]:
    headers = ["model", "N", "strategy", "codec", "wire MiB", "ratio", "sync ms", "rel err", "consistent", "ops"]
    body = [[r.model, r.workers, r.strategy, r.codec, round(r.wire_bytes / 2**20, 2), round(r.compression, 1),
             round(1000 * r.sync_s, 1), float(f"{r.rel_error:.3g}"), "yes" if r.consistent else "NO", r.ops]
            for r in rows]
    return headers, body


def rows_json(rows: list[CompareRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
