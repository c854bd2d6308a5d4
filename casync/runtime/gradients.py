"""Gradients made where they are used: each worker's bucket buffers created by a Ray task on its actor's node.

A benchmark (or a training loop without the Trainer) hands :meth:`GradientStore.refs` to
``RayEngine.run_flat``: loading gradients into the actors then never crosses a link, and the driver never
holds them.
"""
from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..datasets.gradients import bucket_layout, make_bucket_buffers
from ..plan.syncplan import SyncPlan

_MAKER: list[Any] = []


def _remote_maker() -> Any:
    """``make_bucket_buffers`` as a Ray task (registered once per process)."""
    if not _MAKER:
        _MAKER.append(ray.remote(num_cpus=0)(make_bucket_buffers))
    return _MAKER[0]


class GradientStore:
    """Each worker's bucket buffers as ObjectRefs, made on the node the worker's actor runs on and kept
    there across configurations with the same bucket layout."""

    def __init__(self, model: str, seed: int = 0):
        self.model = model
        self.seed = seed
        self._refs: dict[tuple, Any] = {}

    def refs(self, plan: SyncPlan, nodes: list[str]) -> list[Any]:
        """One ObjectRef per worker ``w``, created on ``nodes[w]`` (a Ray node id)."""
        layout = bucket_layout(plan)
        make = _remote_maker()
        out = []
        for w, node in enumerate(nodes):
            key = (layout, w, node)
            if key not in self._refs:
                strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
                self._refs[key] = make.options(scheduling_strategy=strategy).remote(self.model, w, self.seed, layout)
            out.append(self._refs[key])
        ray.wait(out, num_returns=len(out), fetch_local=False)
        return out

    def clear(self) -> None:
        self._refs.clear()
