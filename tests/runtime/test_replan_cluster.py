"""``RayEngine.replan`` between nodes: the data plane that only exists there (tcp's sockets between the nodes'
actors) is closed and formed again, and the new plan gives LocalEngine's bits.  (One machine's transports, and
gloo's process group formed again: tests/runtime/test_replan.py.)"""
from __future__ import annotations

import numpy as np

import casync
from casync.runtime.ray_engine import RayEngine
from tests.helpers import make_grads

SHAPES = {"a": (20_000,), "b": (64, 3)}


def _assert_syncs_match_local(engine, plan, steps):
    """``steps`` syncs give a fresh LocalEngine's bits on every worker, and its residuals."""
    local = casync.LocalEngine(plan)
    for step in range(steps):
        grads = make_grads(SHAPES, plan.workers, seed=step)
        expected, got = local.sync(grads), engine.sync(grads)
        for w in range(plan.workers):
            for name in SHAPES:
                np.testing.assert_array_equal(got[w][name], expected[w][name], err_msg=f"step {step} {name} w{w}")
    for key, value in local.state_dict()["residuals"].items():
        np.testing.assert_array_equal(engine.state_dict()["residuals"][key], value, err_msg=key)


def test_replan_over_tcp_between_nodes(ray_cluster):
    first = casync.build_plan(SHAPES, workers=3, strategy="ring", codec="onebit")
    second = casync.build_plan(SHAPES, workers=2, strategy="ps", servers=1, codec="randomk:ratio=0.05")
    with RayEngine(first, placement="spread", timeout_s=60, transport="tcp") as engine:
        nodes = engine.actor_nodes()
        assert len(set(nodes.values())) == 3
        _assert_syncs_match_local(engine, first, steps=2)
        engine.replan(second)
        assert list(engine.actor_nodes().values()) == list(nodes.values())  # the same processes, in their places
        assert set(engine.interfaces.values()) == {""}  # sockets again, no process group
        _assert_syncs_match_local(engine, second, steps=3)
        engine.replan(first)
        _assert_syncs_match_local(engine, first, steps=2)
