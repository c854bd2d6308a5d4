"""``LocalEngine``: runs a plan in-process, one primitive at a time, in a deterministic topological order.

It defines what a plan means: every other engine must produce bit-identical results for the same plan,
inputs and seed.  Slow by design — it is the reference and the debugger.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from casync.primitives.ir import rank_of
from casync.primitives.ops import run_node

from ..plan.syncplan import SyncPlan
from .contract import EngineBase
from .inputs import check_flats
from .nonfinite import SyncOutput, layouts, scan_worker, void_step, voids_step
from .state import EngineState
from .timeline import op_rows


class LocalEngine(EngineBase):
    """Execute ``plan`` in this process.  ``sync(grads)`` -> per-worker results; state is error feedback."""

    def __init__(self, plan: SyncPlan):
        if not isinstance(plan, SyncPlan):
            raise TypeError(f"LocalEngine needs a SyncPlan, got {type(plan).__name__}")
        plan.require_executable("LocalEngine")
        super().__init__()
        self.plan = plan
        self.state = EngineState()
        self._order = plan.topological_order()
        self._bounds = {b.name: b.partitions for b in plan.buckets}
        self._layouts = layouts(plan)
        self._inputs = {n: [u for u, _, _ in sorted(plan.graph.in_edges(n, data="slot"), key=lambda e: e[2])]
                        for n in self._order}
        self._rank = {n: rank_of(plan.graph.nodes[n]["actor"]) for n in self._order}

    def run_flat(self, flats: list[dict[str, np.ndarray]]) -> SyncOutput:
        """The engine proper, on per-worker flat bucket buffers (``flatten_worker_grads`` output)."""
        plan, graph = self.plan, self.plan.graph
        check_flats(plan, flats, mappings_only=True)
        scans = [scan_worker(self._layouts, w, flats[w]) for w in range(plan.workers)]
        reports = [r for found, _ in scans for r in found]
        if voids_step(plan.nonfinite, reports):
            out = void_step(plan, reports)  # raises under "raise": nothing changed
            self.state = EngineState(step=self.state.step + 1, residuals=self.state.residuals)
            return out
        step = self.state.step
        flagged = {f"worker:{w}": parts for w, (_, parts) in enumerate(scans)}
        residuals = dict(self.state.residuals)  # encode never mutates a residual in place: commit on success
        values: dict[str, Any] = {}
        remaining = {n: graph.out_degree(n) for n in self._order}
        out = [{b.name: np.empty(b.numel, dtype=np.float32) for b in plan.buckets} for _ in range(plan.workers)]
        records: dict[str, list[tuple]] = {}
        for node in self._order:
            a = graph.nodes[node]
            local = None
            if a.get("local_input"):
                start, stop = self._bounds[a["bucket"]][a["part"]]
                local = flats[self._rank[node]][a["bucket"]][start:stop]
            inputs = [values[u] for u in self._inputs[node]]
            t0, cpu0 = time.perf_counter(), time.thread_time()
            result = run_node(a, inputs, local, codecs=plan.codecs, residuals=residuals, plan_seed=plan.seed,
                              step=step, flagged=flagged.setdefault(a["actor"], set()))
            records.setdefault(a["actor"], []).append((a["op"], a["bucket"], a["part"], t0, time.perf_counter(),
                                                       a["nbytes"], node, time.thread_time() - cpu0))
            for u in self._inputs[node]:  # free intermediates as soon as their consumers ran
                remaining[u] -= 1
                if remaining[u] == 0:
                    del values[u]
            if a.get("output"):
                start, stop = self._bounds[a["bucket"]][a["part"]]
                out[self._rank[node]][a["bucket"]][start:stop] = result
            if remaining[node]:
                values[node] = result
        self.state = EngineState(step=step + 1, residuals=residuals)
        self._timeline.add(step, op_rows(step, records))
        return SyncOutput(out, nonfinite=reports)

    def state_dict(self) -> dict[str, Any]:
        """Error-feedback residuals and the step counter (copies; safe to keep)."""
        return self.state.to_dict(self.plan)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; validated against this plan."""
        self.state = EngineState.from_dict(self.plan, state)
