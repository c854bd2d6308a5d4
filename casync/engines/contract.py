"""The engine contract: what every interpreter of a plan offers, whatever runs the ops.

``Engine`` is the Protocol users and tests program against (``LocalEngine``, ``RayEngine``, and engines
added later); ``EngineBase`` gives an engine the parts that are the same everywhere: ``sync`` on user
gradients (checked, flattened into bucket buffers, results shaped back like the inputs), the step
counter, the context manager and the measured timeline.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..plan.syncplan import SyncPlan
from .inputs import flatten_worker_grads, unflatten_results
from .nonfinite import SyncOutput
from .timeline import TimelineBuffer


@runtime_checkable
class Engine(Protocol):
    """Runs a :class:`~casync.plan.syncplan.SyncPlan`: bit-identical results to ``LocalEngine`` (the reference).

    * ``sync(grads)``: ``grads[w][name]`` -> ``out[w][name]`` (NumPy or torch, as given); raises
      :class:`~casync.errors.SyncError` subclasses for faults within the engine's timeout;
    * ``run_flat(flats)``: the same on per-worker flat bucket buffers;
    * ``state_dict()`` / ``load_state_dict(state)``: error-feedback residuals and the step, exactly resumable;
    * ``timeline(step=None)``: per-op records (op, actor, bucket, part, start, end, nbytes, node, step, cpu, queued);
    * ``close()``, and use as a context manager.
    """

    plan: SyncPlan

    @property
    def step(self) -> int: ...

    def sync(self, grads: Any) -> SyncOutput: ...

    def run_flat(self, flats: list[Any]) -> SyncOutput: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def timeline(self, step: int | None = None, relative: bool = True) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Engine": ...

    def __exit__(self, *exc: Any) -> None: ...


class EngineBase:
    """Shared behaviour of engines; a subclass sets ``plan`` and ``state`` and implements ``run_flat``,
    ``state_dict``, ``load_state_dict`` and ``close``."""

    plan: SyncPlan
    name = "engine"

    def __init__(self) -> None:
        self._timeline = TimelineBuffer()

    @property
    def step(self) -> int:
        return self.state.step

    def sync(self, grads: Any) -> SyncOutput:
        """Synchronize one iteration: ``grads[w][name]`` -> ``out[w][name]`` (mean or sum over workers).

        NaN/Inf in a gradient are handled as the plan's ``nonfinite`` option says (see
        :mod:`casync.engines.nonfinite`); ``out.skipped`` and ``out.nonfinite`` tell what happened.
        """
        flats, torch_flags = flatten_worker_grads(self.plan, grads)
        results = self.run_flat(flats)
        return SyncOutput(unflatten_results(self.plan, results, torch_flags), results.skipped, results.nonfinite)

    def timeline(self, step: int | None = None, relative: bool = True) -> list[dict[str, Any]]:
        """Per-op records of recent steps (op, actor, bucket, part, start, end, nbytes, node, step, cpu, queued),
        times in seconds since the first record of the selection (``relative=False``: since the epoch); ``cpu`` is
        the CPU seconds the executing thread spent in the op (less than ``end - start`` when it waited for a core
        or the GIL), ``queued`` the seconds it waited runnable for a core (None where the system does not say);
        :func:`~casync.engines.timeline.op_time_split` sums them."""
        return self._timeline.rows(step, relative)

    def clear_timeline(self) -> None:
        self._timeline.clear()

    def draw_timeline(self, path: str, step: int | None = None) -> str:
        """Write the measured timeline as a Gantt chart PNG, one lane per actor."""
        from ..drawing import draw_gantt

        label = "all steps" if step is None else f"step {step}"
        return draw_gantt(self.timeline(step), path, title=f"{type(self).__name__} measured timeline, {label}: "
                                                           f"{self.plan!r}", actors=self.plan.actors)

    def __enter__(self) -> "EngineBase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release what the engine holds (nothing for an in-process engine)."""


def fresh_results(plan: SyncPlan, per_worker: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Per worker, every bucket's result copied into one fresh writable buffer (views per bucket)."""
    total = sum(b.numel for b in plan.buckets)
    out = []
    for results in per_worker:
        flat, views, offset = np.empty(total, np.float32), {}, 0
        for b in plan.buckets:
            views[b.name] = flat[offset:offset + b.numel]
            offset += b.numel
            views[b.name][...] = results[b.name]
        out.append(views)
    return out
