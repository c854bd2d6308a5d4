"""Helpers shared by test modules: gradient factories and the strategy configurations tests sweep."""
from __future__ import annotations

from typing import Any

import numpy as np

# (strategy, extra build_plan options) covering PS co-located/dedicated, one/two-way, ring, all-gather
STRATEGY_CONFIGS = [
    ("ring", {}),
    ("allgather", {}),
    ("ps", {}),
    ("ps", {"servers": 2}),
    ("ps", {"two_way": False}),
]
STRATEGY_IDS = ["ring", "allgather", "ps-coloc", "ps-2servers", "ps-oneway"]



def applies(codec: str, strategy: str, extra: dict[str, Any]) -> bool:
    """Whether a codec syncs with a strategy configuration: a codec that aggregates by majority vote (signsgd,
    ``Codec.votes``) only on two-way PS with dedicated servers, where the vote is exact (elsewhere its plans are
    refused); every other codec everywhere."""
    from casync.primitives.codecs import get_codec

    return not get_codec(codec).votes or (strategy == "ps" and bool(extra.get("servers"))
                                          and extra.get("two_way", True))


ODD_SHAPES = {"scalar": (), "one": (1,), "prime": (7919,), "matrix": (13, 17), "cube": (3, 5, 2), "small": (2,)}


def same_bits(a, b) -> bool:
    """Equal as stored: dtype, shape and every byte (unlike ``np.array_equal``, -0.0 is not +0.0 and a NaN
    equals the same NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_bits_but_nans(a, b) -> bool:
    """:func:`same_bits`, except that any NaN equals any NaN at the same place: which NaN an operation on two
    NaNs gives (its sign and payload) is left open by IEEE 754, and NumPy's one-element loop picks the other
    operand than its vector loops do."""
    a, b = np.array(a, copy=True), np.array(b, copy=True)
    if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    a[np.isnan(a)] = b[np.isnan(b)] = np.nan
    return a.tobytes() == b.tobytes()


def make_grads(shapes: dict, workers: int, seed: int = 0, dtype=np.float32) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}
            for _ in range(workers)]


def load_benchmark(name: str):
    """A script of ``benchmarks/`` as a module, loaded once (not through sys.path: ``benchmarks/codecs.py`` would
    shadow the standard library's ``codecs``)."""
    import importlib.util
    import sys
    from pathlib import Path

    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def profile_without(profile: Any, op: str) -> Any:
    """``profile`` (a ``casync.Profile``) as written before its codecs' ``op`` cost existed."""
    data = profile.to_dict()
    return type(profile).from_dict({**data, "codecs": {k: {o: v for o, v in ops.items() if o != op}
                                                       for k, ops in data["codecs"].items()}}, source="older")


def assert_syncs_match_local(engine: Any, plan: Any, shapes: dict, steps: int, residuals: bool = False) -> None:
    """``steps`` syncs of ``engine`` give a fresh LocalEngine's bits on every worker (and, with ``residuals``, its
    error-feedback residuals after them)."""
    import casync

    local = casync.LocalEngine(plan)
    for step in range(steps):
        grads = make_grads(shapes, plan.workers, seed=step)
        expected, got = local.sync(grads), engine.sync(grads)
        for w in range(plan.workers):
            for name in shapes:
                np.testing.assert_array_equal(got[w][name], expected[w][name], err_msg=f"step {step} {name} w{w}")
    if residuals:
        for key, value in local.state_dict()["residuals"].items():
            np.testing.assert_array_equal(engine.state_dict()["residuals"][key], value, err_msg=key)
