"""``RayEngine.replan`` between nodes: the data plane that only exists there (tcp's sockets between the nodes'
actors) is closed and formed again, and the new plan gives LocalEngine's bits.  (One machine's transports, and
gloo's process group formed again: tests/runtime/test_replan.py.)"""
from __future__ import annotations

import casync
from casync.runtime.ray_engine import RayEngine
from tests.helpers import assert_syncs_match_local

SHAPES = {"a": (20_000,), "b": (64, 3)}


def test_replan_over_tcp_between_nodes(ray_cluster):
    first = casync.build_plan(SHAPES, workers=3, strategy="ring", codec="onebit")
    second = casync.build_plan(SHAPES, workers=2, strategy="ps", servers=1, codec="randomk:ratio=0.05")
    with RayEngine(first, placement="spread", timeout_s=60, transport="tcp") as engine:
        nodes = engine.actor_nodes()
        assert len(set(nodes.values())) == 3
        assert_syncs_match_local(engine, first, SHAPES, steps=2, residuals=True)
        engine.replan(second)
        assert list(engine.actor_nodes().values()) == list(nodes.values())  # the same processes, in their places
        assert set(engine.interfaces.values()) == {""}  # sockets again, no process group
        assert_syncs_match_local(engine, second, SHAPES, steps=3, residuals=True)
        engine.replan(first)
        assert_syncs_match_local(engine, first, SHAPES, steps=2, residuals=True)
