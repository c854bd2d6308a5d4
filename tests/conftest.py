"""Shared fixtures: an embedded Ray and a multi-node Ray cluster, each shared by the modules in turn, and the markers' rules."""
from __future__ import annotations

import os
import sys
import time

import pytest

from tests.helpers import make_grads


@pytest.fixture
def grads_factory():
    return make_grads


_EMBEDDED: dict[str, str] = {}  # the GCS address of the embedded Ray this session started last


@pytest.fixture(scope="module")
def ray_local():
    """An embedded local Ray, shared by the modules that use it one after another (starting Ray costs ~4 s).

    A module gets a fresh one when the last was shut down (by a test, or for a cluster module), or when it
    was left holding CPUs: a module that leaves actors or reservations behind never leaks into the next."""
    ray = pytest.importorskip("ray")
    from casync.runtime.ray_layer import connect_ray

    if not _shared_ray_is_up(ray):
        if ray.is_initialized():
            ray.shutdown()
        connect_ray(None, num_cpus=4, object_store_memory=256 * 2**20)  # embedded, bound to 127.0.0.1
        _EMBEDDED["address"] = ray.get_runtime_context().gcs_address
    yield ray
    if ray.is_initialized() and not _all_cpus_free(ray):
        ray.shutdown()


def _shared_ray_is_up(ray) -> bool:
    """Whether the Ray this process is connected to is the embedded one ``ray_local`` started last."""
    return ray.is_initialized() and ray.get_runtime_context().gcs_address == _EMBEDDED.get("address")


def _all_cpus_free(ray, wait_s: float = 5.0) -> bool:
    """Whether the embedded Ray's CPUs are all free again (released actors return theirs within moments)."""
    deadline = time.monotonic() + wait_s
    while True:
        if ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


@pytest.fixture(scope="module", autouse=True)
def _no_shared_ray_where_unused(request):
    """A module that does not use ``ray_local`` (``ray_cluster``) runs without the shared Ray's (cluster's)
    processes, as if it were alone."""
    if request.node.nodeid not in request.config.stash.get(_RAY_MODULES, set()):
        ray = sys.modules.get("ray")
        if ray is not None and _shared_ray_is_up(ray):
            ray.shutdown()
    if request.node.nodeid not in request.config.stash.get(_CLUSTER_MODULES, set()):
        _stop_cluster()
    yield


@pytest.fixture(scope="session", autouse=True)
def _ray_down_at_the_end():
    yield
    _stop_cluster()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


_CLUSTER: dict = {}  # the 3-node cluster ray_cluster started last ("cluster") and its nodes' ids ("nodes")


@pytest.fixture(scope="module")
def ray_cluster():
    """A 3-node Ray cluster on this machine (several raylets), for multi-node placement tests; shared, as
    ``ray_local`` is, by the modules that use it one after another (a start costs ~3 Ray starts).

    A module gets a fresh one when it was shut down, or when the last module left it changed: a node removed or
    added, or CPUs held (actors or reservations left behind): a module that does that never leaks into the next."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if not _cluster_is_clean(ray):
        _stop_cluster()
        if ray.is_initialized():
            ray.shutdown()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 96 * 2**20,
                                                                "include_dashboard": False})
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=96 * 2**20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        _CLUSTER.update(cluster=cluster, nodes=_alive_nodes(ray))
    yield _CLUSTER["cluster"]
    if not _cluster_is_clean(ray):
        _stop_cluster()


def _alive_nodes(ray) -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def _cluster_is_clean(ray) -> bool:
    """Whether this process is connected to the cluster ``ray_cluster`` started last, with the nodes it started
    with (alive, no other) and every CPU free."""
    cluster = _CLUSTER.get("cluster")
    return (cluster is not None and ray.is_initialized()
            and ray.get_runtime_context().gcs_address == cluster.address
            and _alive_nodes(ray) == _CLUSTER["nodes"] and _all_cpus_free(ray))


def _stop_cluster() -> None:
    """Shut the kept cluster down, and disconnect from it (nothing when there is none)."""
    cluster = _CLUSTER.pop("cluster", None)
    _CLUSTER.pop("nodes", None)
    if cluster is None:
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and ray.get_runtime_context().gcs_address == cluster.address:
        ray.shutdown()
    cluster.shutdown()


_FIXTURE_MARKS = {"ray_local": "ray", "ray_cluster": "cluster"}


_RAY_MODULES = pytest.StashKey[set]()
_CLUSTER_MODULES = pytest.StashKey[set]()


def pytest_collection_modifyitems(config, items):
    """Tests that use the embedded Ray or the multi-node cluster carry the ``ray`` / ``cluster`` marker, so
    ``-m "not ray"`` runs the Ray-free suite in seconds; modules that use the embedded Ray are noted, and run
    one after another after the Ray-free ones (each module keeps its own order): the shared Ray then starts
    once instead of once per Ray module between Ray-free ones (a start and a stop cost ~5 s and ~6 CPU-s); the
    modules that use the 3-node cluster run last, together, for the same reason.  A
    module whose tests ask for ``ray_local`` at run time (``request.getfixturevalue``) says so with a module-level
    ``USES_RAY_LOCAL = True``."""
    ray_modules = {_module(item) for item in items if "ray_local" in getattr(item, "fixturenames", ())
                   or getattr(getattr(item, "module", None), "USES_RAY_LOCAL", False)}
    cluster_modules = {_module(item) for item in items if "ray_cluster" in getattr(item, "fixturenames", ())}
    config.stash[_RAY_MODULES] = ray_modules
    config.stash[_CLUSTER_MODULES] = cluster_modules
    for item in items:
        for fixture, mark in _FIXTURE_MARKS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(mark)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # a worker of `-n`: every worker sorts alike (xdist checks that the collections agree), and the
        # scheduler below hands out whole modules in this order to whichever worker is free.  Longest first
        # (the cluster's modules, then the embedded Ray's, each with its slow-marked modules ahead), so that
        # the many short Ray-free modules fill the end and both workers finish together; a worker that takes
        # several Ray modules in a row keeps one embedded Ray for them.
        slow_modules = {_module(item) for item in items if item.get_closest_marker("slow") is not None}
        items.sort(key=lambda item: (_module(item) not in cluster_modules, _module(item) not in ray_modules,
                                     _module(item) not in slow_modules))
    else:
        # stable: collection order within each group; the cluster's modules last, one after another, as
        # ray_local's
        items.sort(key=lambda item: (_module(item) in cluster_modules, _module(item) in ray_modules))


@pytest.hookimpl(optionalhook=True)  # optional: the suite also runs without xdist (-p no:xdist, or not installed)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the README's test command): one worker per core this process may run on, at most 4 (each
    may hold its own embedded Ray)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole modules to one worker each (module fixtures, such as the shared Ray, are made once), handed out in
    the collection order above rather than xdist's default of most tests first (test counts say little about
    cost here: 682 codec tests take 8 s, one Ray Train test 38 s)."""
    if config.getoption("dist") not in ("load", "loadfile"):
        return None  # the user asked for another mode
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False
    return LoadFileScheduling(config, log)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]
