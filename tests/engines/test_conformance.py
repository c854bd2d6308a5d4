"""The conformance matrix: every engine x every strategy x a lossless and two lossy codecs x 2-5 workers.

Each cell runs three syncs with error feedback (see ``conformance.check_conformance``).  Worker counts
rotate through 2..5 over the (strategy, codec) pairs, so every strategy meets several worker counts
without running the full cross product on Ray; an engine that is another one over a different transport
runs every strategy with one codec.
"""
from __future__ import annotations

import pytest

import casync
from tests.engines.conformance import ENGINES, SHAPES, check_conformance

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
#: engines that differ from another only in how payload bytes travel (RayEngine over gloo alone, against its
#: shared-memory default): one codec per strategy, the lossy one with error feedback
TRANSPORT_VARIANTS = {"ray-gloo": ("onebit",)}


def _matrix():
    for name, (_, needs_ray) in ENGINES.items():
        for strategy, codec, workers in CELLS:
            if codec in TRANSPORT_VARIANTS.get(name, CODECS):
                yield pytest.param(name, strategy, codec, workers, marks=[pytest.mark.ray] if needs_ray else [],
                                   id=f"{name}-{strategy}-{codec}-N{workers}")


@pytest.mark.parametrize("engine_name,strategy,codec,workers", list(_matrix()))
def test_engine_conforms(engine_name, strategy, codec, workers, request):
    if ENGINES[engine_name][1]:
        request.getfixturevalue("ray_local")
    plan = casync.build_plan(SHAPES, workers=workers, codec=None if codec == "none" else codec, partitions=3,
                             bucket_bytes=1 << 12, **STRATEGIES[strategy])
    check_conformance(plan, ENGINES[engine_name][0])


def test_every_registered_strategy_is_in_the_matrix():
    from casync.strategies import STRATEGIES as REGISTRY

    covered = {args["strategy"] for args in STRATEGIES.values()}
    builtin = {name for name in REGISTRY if not name.startswith("toy")}
    assert builtin <= covered, f"strategies without conformance cells: {sorted(builtin - covered)}"
