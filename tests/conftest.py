"""Shared fixtures: gradient factories and strategy configurations used across test modules."""
from __future__ import annotations

import numpy as np
import pytest

# (strategy, extra build_plan options) covering PS co-located/dedicated, one/two-way, ring, all-gather
STRATEGY_CONFIGS = [
    ("ring", {}),
    ("allgather", {}),
    ("ps", {}),
    ("ps", {"servers": 2}),
    ("ps", {"two_way": False}),
]
STRATEGY_IDS = ["ring", "allgather", "ps-coloc", "ps-2servers", "ps-oneway"]

ODD_SHAPES = {"scalar": (), "one": (1,), "prime": (7919,), "matrix": (13, 17), "cube": (3, 5, 2), "small": (2,)}


def make_grads(shapes: dict, workers: int, seed: int = 0, dtype=np.float32) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}
            for _ in range(workers)]


@pytest.fixture
def grads_factory():
    return make_grads


@pytest.fixture(scope="module")
def ray_local():
    """One embedded local Ray per test module (starting Ray costs seconds), torn down after the module."""
    ray = pytest.importorskip("ray")
    from casync.runtime.ray_engine import connect_ray

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
