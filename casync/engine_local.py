"""``LocalEngine``: runs a plan in-process, one primitive at a time, in a deterministic topological order.

It defines what a plan means: every other engine must produce bit-identical results for the same plan,
inputs and seed.  Slow by design — it is the reference and the debugger.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .inputs import flatten_worker_grads, unflatten_results
from .kernels import run_node
from .plan import SyncPlan
from .state import EngineState


class LocalEngine:
    """Execute ``plan`` in this process.  ``sync(grads)`` -> per-worker results; state is error feedback."""

    def __init__(self, plan: SyncPlan):
        if not isinstance(plan, SyncPlan):
            raise TypeError(f"LocalEngine needs a SyncPlan, got {type(plan).__name__}")
        plan.require_executable("LocalEngine")
        self.plan = plan
        self.state = EngineState.empty(plan)
        self._order = plan.topological_order()
        self._bounds = {b.name: b.partitions for b in plan.buckets}
        self._inputs = {n: [u for u, _, _ in sorted(plan.graph.in_edges(n, data="slot"), key=lambda e: e[2])]
                        for n in self._order}

    @property
    def step(self) -> int:
        return self.state.step

    def sync(self, grads: Any) -> list[dict[str, Any]]:
        """Synchronize one iteration: ``grads[w][name]`` -> ``out[w][name]`` (mean or sum over workers)."""
        flats, torch_flags = flatten_worker_grads(self.plan, grads)
        results = self.run_flat(flats)
        return unflatten_results(self.plan, results, torch_flags)

    def run_flat(self, flats: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The engine proper, on per-worker flat bucket buffers (already validated)."""
        plan, graph = self.plan, self.plan.graph
        residuals = dict(self.state.residuals)  # encode never mutates a residual in place: commit on success
        values: dict[str, Any] = {}
        remaining = {n: graph.out_degree(n) for n in self._order}
        out = [{b.name: np.empty(b.numel, dtype=np.float32) for b in plan.buckets} for _ in range(plan.workers)]
        for node in self._order:
            a = graph.nodes[node]
            local = None
            if a.get("local_input"):
                start, stop = self._bounds[a["tensor"]][a["part"]]
                local = flats[int(a["actor"].split(":")[1])][a["tensor"]][start:stop]
            inputs = [values[u] for u in self._inputs[node]]
            result = run_node(a, inputs, local, codecs=plan.codecs, residuals=residuals,
                              plan_seed=plan.seed, step=self.state.step)
            for u in self._inputs[node]:  # free intermediates as soon as their consumers ran
                remaining[u] -= 1
                if remaining[u] == 0:
                    del values[u]
            if a.get("output"):
                start, stop = self._bounds[a["tensor"]][a["part"]]
                out[int(a["actor"].split(":")[1])][a["tensor"]][start:stop] = result
            if remaining[node]:
                values[node] = result
        self.state = EngineState(step=self.state.step + 1, residuals=residuals)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Error-feedback residuals and the step counter (copies; safe to keep)."""
        return self.state.to_dict(self.plan)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; validated against this plan."""
        self.state = EngineState.from_dict(self.plan, state)
