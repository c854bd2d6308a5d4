"""The conformance check every engine must pass, and the engines it runs on (a new engine adds one entry).

An engine conforms when, for the same plan, inputs and steps (error feedback carried between them):
its results are bit for bit LocalEngine's, every worker holds bit-identical results, with a lossless
codec they equal the exact mean, and its state_dict (residuals and step) equals LocalEngine's.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

import casync
from tests.helpers import same_bits

SHAPES = {"w": (37, 11), "b": (11,), "tail": (3,), "big": (5000,)}


@contextmanager
def _local(plan: casync.SyncPlan) -> Iterator[Any]:
    with casync.LocalEngine(plan) as engine:
        yield engine


def _ray(transport: str) -> Callable[[casync.SyncPlan], Any]:
    @contextmanager
    def make(plan: casync.SyncPlan) -> Iterator[Any]:
        from casync.runtime.ray_engine import RayEngine

        with RayEngine(plan, timeout_s=60, transport=transport) as engine:
            yield engine

    return make


@contextmanager
def _torch_dist(plan: casync.SyncPlan) -> Iterator[Any]:
    from casync.torch.engine import TorchDistEngine

    with TorchDistEngine(plan, timeout_s=60) as engine:
        yield engine


#: the Ray engines' names -> their transports
RAY_TRANSPORTS = {"ray-direct": "direct", "ray-gloo": "gloo", "ray-objectstore": "objectstore"}

#: engine name -> (context manager making a fresh engine for a plan, needs Ray)
ENGINES: dict[str, tuple[Callable[[casync.SyncPlan], Any], bool]] = {
    "local": (_local, False),
    "torch-dist": (_torch_dist, False),
    **{name: (_ray(transport), True) for name, transport in RAY_TRANSPORTS.items()},
}


class RayEngines:
    """Ray engines kept from one conformance cell to the next: a cell whose plan has as many actors as a kept engine
    of its transport re-plans it (``RayEngine.replan``) instead of starting actors, which costs most of a Ray
    cell's time; the first cell of each (transport, actor count) starts its engine, so every transport keeps a fresh
    start.  A cell gets the same contract from a re-planned engine (step 0, no residuals, a fresh engine's bits),
    and what it asserts is unchanged.  The object store cannot re-plan: its cells start engines of their own."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, int], Any] = {}

    def maker(self, transport: str) -> Callable[[casync.SyncPlan], Any]:
        """What ``check_conformance`` takes: a context manager making the engine for a plan."""
        if transport == "objectstore":
            return _ray(transport)

        @contextmanager
        def make(plan: casync.SyncPlan) -> Iterator[Any]:
            from casync.runtime.ray_engine import RayEngine

            key = (transport, len(plan.actors))
            engine = self._kept.pop(key, None)
            try:
                if engine is None:
                    engine = RayEngine(plan, timeout_s=60, transport=transport)
                else:
                    engine.replan(plan)
                yield engine
            except BaseException:  # a cell that failed keeps nothing for the next one
                if engine is not None:
                    engine.close()
                raise
            self._kept[key] = engine

        return make

    def close(self) -> None:
        for engine in self._kept.values():
            engine.close()
        self._kept = {}


def step_grads(workers: int, step: int, shapes: dict = SHAPES) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1000 + step)
    return [{n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()} for _ in range(workers)]


def check_conformance(plan: casync.SyncPlan, make_engine: Callable[[casync.SyncPlan], Any], steps: int = 3) -> None:
    """Run ``steps`` syncs on the engine and on LocalEngine; assert the contract (see the module docstring)."""
    reference = casync.LocalEngine(plan)
    with make_engine(plan) as engine:
        for step in range(steps):
            grads = step_grads(plan.workers, step, {t.name: t.shape for t in plan.tensors})
            want = reference.sync(grads)
            got = engine.sync(grads)
            for w in range(plan.workers):
                for name in want[w]:
                    assert same_bits(got[w][name], want[w][name]), \
                        f"step {step}, worker {w}, {name}: differs from LocalEngine"
                    assert same_bits(got[w][name], got[0][name]), f"step {step}: worker {w} != worker 0 ({name})"
            if all(b.codec.lossless for b in plan.buckets):
                scale = plan.workers if plan.options.get("op", "mean") == "mean" else 1
                for name in want[0]:
                    exact = np.sum([g[name] for g in grads], axis=0, dtype=np.float64) / scale
                    np.testing.assert_allclose(got[0][name], exact, rtol=1e-5, atol=1e-5)
        state, ref_state = engine.state_dict(), reference.state_dict()
        assert state["step"] == ref_state["step"] == steps
        assert state["residuals"].keys() == ref_state["residuals"].keys()
        for key, value in ref_state["residuals"].items():
            assert same_bits(state["residuals"][key], value), f"residual {key} differs from LocalEngine"
