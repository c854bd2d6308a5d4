"""Engine state that must survive a restart: the step counter and error-feedback residuals."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..plan.syncplan import SyncPlan

STATE_VERSION = 1


def residual_shapes(plan: SyncPlan) -> dict[str, int]:
    """Every error-feedback key the plan uses and the length of its residual."""
    return {a["ef_key"]: a["numel"] for _, a in plan.graph.nodes(data=True) if a["op"] == "encode" and a["ef"]}


@dataclass
class EngineState:
    """Residuals keyed by ``"<role>/<tensor>/<part>"`` (see ``casync.strategies.base``) plus the iteration count."""

    step: int = 0
    residuals: dict[str, np.ndarray] = field(default_factory=dict)

    def to_dict(self, plan: SyncPlan) -> dict[str, Any]:
        return {"version": STATE_VERSION, "step": self.step, "workers": plan.workers,
                "residuals": {k: v.copy() for k, v in sorted(self.residuals.items())}}

    @classmethod
    def from_dict(cls, plan: SyncPlan, state: Any) -> "EngineState":
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        for key in ("version", "step", "residuals"):
            if key not in state:
                raise ValueError(f"state is missing {key!r}; expected the output of state_dict()")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"state version {state['version']!r} is not supported (expected {STATE_VERSION})")
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"state step must be a non-negative int, got {step!r}")
        if state.get("workers", plan.workers) != plan.workers:
            raise ValueError(f"state was saved with {state['workers']} workers, plan has {plan.workers}")
        if not isinstance(state["residuals"], dict):
            raise TypeError(f"state 'residuals' must be a dict key -> array, got {type(state['residuals']).__name__}")
        expected = residual_shapes(plan)
        residuals = {}
        for key, value in state["residuals"].items():
            if key not in expected:
                raise ValueError(f"state has a residual for {key!r}, which this plan does not use")
            array = np.asarray(value)
            if array.dtype != np.float32 or array.shape != (expected[key],):
                raise ValueError(f"residual {key!r}: expected float32 of shape ({expected[key]},), "
                                 f"got {array.dtype} {array.shape}")
            if not np.isfinite(array).all():
                raise ValueError(f"residual {key!r} holds NaN or Inf; error-feedback state must be finite")
            residuals[key] = array.copy()
        return cls(step=int(step), residuals=residuals)
