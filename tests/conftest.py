"""Shared fixtures: one embedded Ray per module, a multi-node Ray cluster, and the markers' rules."""
from __future__ import annotations

import pytest

from tests.helpers import make_grads


@pytest.fixture
def grads_factory():
    return make_grads


@pytest.fixture(scope="module")
def ray_local():
    """One embedded local Ray per test module (starting Ray costs seconds), torn down after the module."""
    ray = pytest.importorskip("ray")
    from casync.runtime.ray_layer import connect_ray

    if ray.is_initialized():
        ray.shutdown()
    connect_ray(None, num_cpus=4, object_store_memory=256 * 2**20)  # embedded, bound to 127.0.0.1
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster():
    """A 3-node Ray cluster on this machine (several raylets), for multi-node placement tests."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 96 * 2**20,
                                                            "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1, object_store_memory=96 * 2**20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


_FIXTURE_MARKS = {"ray_local": "ray", "ray_cluster": "cluster"}


def pytest_collection_modifyitems(config, items):
    """Tests that use the embedded Ray or the multi-node cluster carry the ``ray`` / ``cluster`` marker, so
    ``-m "not ray"`` runs the Ray-free suite in seconds."""
    for item in items:
        for fixture, mark in _FIXTURE_MARKS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(mark)
