"""RayEngine on a 3-node ray.cluster_utils.Cluster: actors really land on different nodes."""
from __future__ import annotations

import numpy as np

import casync
from casync.runtime.ray_engine import RayEngine
from tests.helpers import assert_syncs_match_local, make_grads


def test_spread_places_actors_on_distinct_nodes_and_matches_local(ray_cluster):
    shapes = {"a": (20_000,), "b": (64, 3)}
    plan = casync.build_plan(shapes, workers=3, strategy="ring", codec="onebit")
    with RayEngine(plan, placement="spread", timeout_s=60) as engine:
        nodes = engine.actor_nodes()
        assert len(set(nodes.values())) == 3, nodes
        assert_syncs_match_local(engine, plan, shapes, steps=2)


def test_tcp_between_nodes_matches_local_and_forms_no_process_group(ray_cluster):
    """transport="tcp": TCP sockets between the nodes' actors instead of a gloo group (so no interface)."""
    shapes = {"a": (20_000,), "b": (64, 3)}
    plan = casync.build_plan(shapes, workers=3, strategy="ps", codec="randomk:ratio=0.05")
    with RayEngine(plan, placement="spread", timeout_s=60, transport="tcp") as engine:
        assert len(set(engine.actor_nodes().values())) == 3
        assert set(engine.interfaces.values()) == {""}  # no process group was formed
        assert_syncs_match_local(engine, plan, shapes, steps=3)


def test_pack_with_dedicated_servers(ray_cluster):
    shapes = {"a": (5000,)}
    plan = casync.build_plan(shapes, workers=2, strategy="ps", servers=2, partitions=2, codec="topk:ratio=0.05")
    local = casync.LocalEngine(plan)
    with RayEngine(plan, placement="pack") as engine:
        nodes = engine.actor_nodes()
        assert len(nodes) == 4 and len(set(nodes.values())) < 4  # packed: some actors share a node
        grads = make_grads(shapes, 2)
        np.testing.assert_array_equal(engine.sync(grads)[1]["a"], local.sync(grads)[1]["a"])
