"""The garbage collector in processes casync owns: set-up's heap frozen out of full collections, garbage from
set-up collected first, what later steps allocate still collected."""
from __future__ import annotations

import gc
import subprocess
import sys

import casync
from casync.runtime.ray_engine import RayEngine
from tests.helpers import make_grads

PROBE = r"""
import gc, weakref
from casync.engines.collector import freeze_setup_heap

class Node:
    pass

setup = [Node() for _ in range(50_000)]  # what set-up keeps
cycle = Node(); cycle.me = cycle; dead = weakref.ref(cycle); del cycle  # garbage set-up left behind
tracked = len(gc.get_objects())
frozen = freeze_setup_heap()
later = Node(); later.me = later; gone = weakref.ref(later); del later  # a step's garbage
gc.collect()
print(dead() is None, frozen >= 50_000, len(gc.get_objects()) < tracked - 50_000, gone() is None)
"""


def test_freezing_keeps_setups_heap_out_of_collections_and_collects_garbage_before_and_after():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True"] * 4, out.stdout + out.stderr


def test_ray_engines_actors_freeze_their_set_up_heap(ray_local):
    shapes = {"w": (300,), "b": (7,)}
    plan = casync.build_plan(shapes, workers=2, strategy="ring", codec="onebit")
    with RayEngine(plan) as engine:
        engine.sync(make_grads(shapes, 2))
        import ray

        frozen = ray.get([a.__ray_call__.remote(lambda self: gc.get_freeze_count()) for a in engine.actors.values()])
    assert all(count > 1000 for count in frozen), frozen
