"""The conformance matrix: every engine x every strategy x a lossless and two lossy codecs x 2-5 workers.

Each cell runs three syncs with error feedback (see ``conformance.check_conformance``).  Worker counts
rotate through 2..5 over the (strategy, codec) pairs, so every strategy meets several worker counts
without running the full cross product on Ray; an engine whose actors do nothing codec- or strategy-specific
of their own runs a subset of the cells (``VARIANT_CELLS``).  A Ray cell re-plans the engine an earlier cell of its
transport and actor count left running (``conformance.RayEngines``; the first such cell starts it), so the
matrix starts 13 Ray engines instead of 23 (ray-direct: 5 for 15 cells); the object store's cells start their own.
"""
from __future__ import annotations

import pytest

import casync
from tests.engines.conformance import ENGINES, RAY_TRANSPORTS, SHAPES, RayEngines, check_conformance

USES_RAY_LOCAL = True  # the Ray engines' cells ask for the shared embedded Ray (tests/conftest.py)

STRATEGIES = {
    "ring": dict(strategy="ring"),
    "allgather": dict(strategy="allgather"),
    "ps-coloc": dict(strategy="ps"),
    "ps-oneway": dict(strategy="ps", two_way=False),
    "ps-dedicated": dict(strategy="ps", servers=2),
}
CODECS = ("none", "onebit", "topk:ratio=0.1")
CELLS = [(s, c, 2 + i % 4) for i, (s, c) in enumerate((s, c) for s in STRATEGIES for c in CODECS)]
#: engines that run a subset of the cells (strategy -> its one codec):
#:
#: * ``ray-gloo`` differs from ``ray-direct`` only in how payload bytes travel (every payload over one gloo
#:   process group, TorchChannel's tagged isend/irecv between ranks): the lossy codec with error feedback, over
#:   the three message patterns a channel meets — a chain of neighbours (ring), every worker to every worker at
#:   once (allgather; co-located and one-way PS exchange the same way, a partition's owner taking from all),
#:   and ranks that are not workers (dedicated servers).
#: * ``ray-objectstore``'s actor (``casync.runtime.ray_actor.SyncActor``) is codec-agnostic: it runs each task's
#:   ops with ``run_node``, the function LocalEngine runs, and Ray carries whatever the op returned; the plan's
#:   strategy decides its program (tasks, hops, fusion).  Every strategy once, each codec on at least one of
#:   them (the lossless one twice, with the exact-mean check), worker counts 2..5 as in ``CELLS``; the
#:   strategy x codec cross product is ray-direct's and LocalEngine's.
VARIANT_CELLS = {
    "ray-gloo": {"ring": "onebit", "allgather": "onebit", "ps-dedicated": "onebit"},
    "ray-objectstore": {"ring": "onebit", "allgather": "none", "ps-coloc": "topk:ratio=0.1", "ps-oneway": "onebit",
                        "ps-dedicated": "none"},
}

#: GRACE's compressors and BytePS's dithering (issue #45): every strategy on the in-process engine, one cell on each
#: engine that moves payloads between processes (their encode, decode and merge are ``run_node``'s, as LocalEngine's;
#: what differs is how payload bytes travel, which the new codecs' layouts exercise once).  signsgd's vote is exact
#: only on PS with dedicated servers (elsewhere its plans are refused: tests/primitives/test_grace_codecs.py).
GRACE_CODECS = ("onebit2", "natural", "u8bit", "sketch", "dithering", "signsgd")
GRACE_CELLS = [(s, c, 2 + i % 4) for i, (s, c) in enumerate(
    (s, c) for s in STRATEGIES for c in GRACE_CODECS if c != "signsgd" or s == "ps-dedicated")]
GRACE_ENGINE_CELLS = {"torch-dist": ("ring", "natural"), "ray-direct": ("allgather", "sketch"),
                      "ray-gloo": ("ps-dedicated", "signsgd")}


def _matrix():
    for name, (_, needs_ray) in ENGINES.items():
        for strategy, codec, workers in CELLS + GRACE_CELLS:
            if codec in GRACE_CODECS:
                chosen = name == "local" or GRACE_ENGINE_CELLS.get(name) == (strategy, codec)
            else:
                chosen = name not in VARIANT_CELLS or VARIANT_CELLS[name].get(strategy) == codec
            if chosen:
                yield pytest.param(name, strategy, codec, workers, marks=[pytest.mark.ray] if needs_ray else [],
                                   id=f"{name}-{strategy}-{codec}-N{workers}")


@pytest.fixture(scope="module")
def ray_engines(ray_local):
    """The Ray engines the cells re-plan (``conformance.RayEngines``), closed before the shared Ray is checked."""
    engines = RayEngines()
    yield engines
    engines.close()


@pytest.mark.parametrize("engine_name,strategy,codec,workers", list(_matrix()))
def test_engine_conforms(engine_name, strategy, codec, workers, request):
    make = ENGINES[engine_name][0]
    if ENGINES[engine_name][1]:
        make = request.getfixturevalue("ray_engines").maker(RAY_TRANSPORTS[engine_name])
    plan = casync.build_plan(SHAPES, workers=workers, codec=None if codec == "none" else codec, partitions=3,
                             bucket_bytes=1 << 12, **STRATEGIES[strategy])
    check_conformance(plan, make)


def test_every_registered_strategy_is_in_the_matrix():
    from casync.strategies import STRATEGIES as REGISTRY

    covered = {args["strategy"] for args in STRATEGIES.values()}
    builtin = {name for name in REGISTRY if not name.startswith("toy")}
    assert builtin <= covered, f"strategies without conformance cells: {sorted(builtin - covered)}"


def test_every_subset_cell_is_in_the_matrix_and_the_object_store_meets_every_strategy_and_codec():
    """A misspelt strategy or codec in VARIANT_CELLS would drop its cell silently."""
    cells = {(p.values[0], p.values[1], p.values[2]) for p in _matrix()}
    for name, chosen in VARIANT_CELLS.items():
        assert {(s, c) for e, s, c in cells if e == name and c not in GRACE_CODECS} == set(chosen.items()), name
    for name, cell in GRACE_ENGINE_CELLS.items():
        assert {(s, c) for e, s, c in cells if e == name and c in GRACE_CODECS} == {cell}, name
    assert set(VARIANT_CELLS["ray-objectstore"]) == set(STRATEGIES)
    assert set(VARIANT_CELLS["ray-objectstore"].values()) == set(CODECS)
