"""Engines that share the Ray an engine started: closing the one that started it leaves Ray up for the others,
and the last one to close stops it.  (No ``ray_local`` here: the first engine starts an embedded Ray itself.)"""
from __future__ import annotations

import numpy as np
import pytest

import casync
from tests.helpers import make_grads

ray = pytest.importorskip("ray")


def test_closing_the_engine_that_started_ray_leaves_it_to_the_others(monkeypatch):
    from casync.runtime.ray_engine import RayEngine

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    plan = casync.build_plan({"w": (1000,)}, workers=2, strategy="ring", codec="onebit")
    grads = make_grads({"w": (1000,)}, 2)
    expected = casync.LocalEngine(plan).sync(grads)
    first = RayEngine(plan, timeout_s=30)  # starts the embedded Ray
    second = RayEngine(plan, timeout_s=30)  # joins it
    try:
        first.close()
        assert ray.is_initialized(), "closing the first engine stopped the Ray the second still uses"
        np.testing.assert_array_equal(second.sync(grads)[1]["w"], expected[1]["w"])
    finally:
        first.close()
        second.close()
    assert not ray.is_initialized(), "the last engine to close stops the Ray an engine started"
