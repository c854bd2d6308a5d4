"""The conformance matrix: every engine x every strategy x a lossless and two lossy codecs x 2-5 workers.

Each cell runs three syncs with error feedback (see ``conformance.check_conformance``).  Worker counts
rotate through 2..5 over the (strategy, codec) pairs, so every strategy meets several worker counts
without running the full cross product on Ray.
"""
from __future__ import annotations

import pytest

import casync
from tests.engines.conformance import ENGINES, SHAPES, check_conformance

STRATEGIES = {
    "ring": dict(strategy="ring"),
    "allgather": dict(strategy="allgather"),
    "ps-coloc": dict(strategy="ps"),
    "ps-oneway": dict(strategy="ps", two_way=False),
    "ps-dedicated": dict(strategy="ps", servers=2),
}
CODECS = ("none", "onebit", "topk:ratio=0.1")
CELLS = [(s, c, 2 + i % 4) for i, (s, c) in enumerate((s, c) for s in STRATEGIES for c in CODECS)]


def _engine_params():
    for name, (_, needs_ray) in ENGINES.items():
        yield pytest.param(name, marks=[pytest.mark.ray] if needs_ray else [], id=name)


@pytest.fixture(params=list(_engine_params()), scope="module")
def engine_name(request):
    if ENGINES[request.param][1]:
        request.getfixturevalue("ray_local")
    return request.param


@pytest.mark.parametrize("strategy,codec,workers", CELLS, ids=[f"{s}-{c}-N{w}" for s, c, w in CELLS])
def test_engine_conforms(engine_name, strategy, codec, workers):
    plan = casync.build_plan(SHAPES, workers=workers, codec=None if codec == "none" else codec, partitions=3,
                             bucket_bytes=1 << 12, **STRATEGIES[strategy])
    check_conformance(plan, ENGINES[engine_name][0])


def test_every_registered_strategy_is_in_the_matrix():
    from strategies import STRATEGIES as REGISTRY

    covered = {args["strategy"] for args in STRATEGIES.values()}
    builtin = {name for name in REGISTRY if not name.startswith("toy")}
    assert builtin <= covered, f"strategies without conformance cells: {sorted(builtin - covered)}"
