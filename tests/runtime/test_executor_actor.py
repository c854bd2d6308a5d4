"""The Ray sync actor's own state between steps (``casync.runtime.executor_actor.ExecutorActor``), driven without Ray
over an in-process hub: residual memory reused from the third step on when each step is kept for a rollback (the
ObjectRef path), and a rollback that restores the residuals bit for bit."""
from __future__ import annotations

import threading

import numpy as np

import casync
from casync.engines.memory import WARMUP_SYNCS
from casync.engines.inputs import flatten_worker_grads
from casync.engines.nonfinite import layouts
from casync.runtime.executor_actor import ExecutorActor
from casync.schedule import actor_shares
from casync.transport.base import LocalHub
from casync.primitives.residuals import buffers
from tests.helpers import make_grads, same_bits

SHAPES = {"w": (301,), "b": (17, 5), "c": (2,)}


def sync_actors(plan):
    hub, shares = LocalHub(timeout_s=10), actor_shares(plan)
    parts = {b.name: list(b.partitions) for b in plan.buckets}
    actors = {a: ExecutorActor(a, shares[a], plan.codecs, plan.seed, parts, layouts(plan), 10.0) for a in plan.actors}
    for name, actor in actors.items():
        actor._on_channel(hub.channel(name))
    return actors


def run(actors, step, flats, keep_previous=True):
    """One step on every actor in threads, gradients unscanned (as ObjectRef gradients arrive); results copied."""
    got, errors = {}, []

    def go(name, actor):
        try:
            index = int(name.split(":")[1])
            results, _, reports = actor.run_step(step, flats[index], None, keep_previous)
            got[name] = {b: r.copy() for b, r in results.items()}
            assert not reports
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=item) for item in actors.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return got


def test_kept_for_a_rollback_the_residuals_two_steps_back_take_the_new_ones_from_the_third_step_on():
    """What the bench counts on: after WARMUP_SYNCS steps no step writes residuals into fresh memory, also
    on the path that keeps each step's residuals for a rollback; results and residuals are LocalEngine's."""
    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, bucket_bytes=600, strategy="ring")
    actors, reference = sync_actors(plan), casync.LocalEngine(plan)
    held = []
    for step in range(5):
        flats, _ = flatten_worker_grads(plan, make_grads(SHAPES, 3, seed=step))
        want, got = reference.run_flat(flats), run(actors, step, flats)
        for w in range(3):
            assert all(np.array_equal(got[f"worker:{w}"][b], want[w][b]) for b in want[w]), (step, w)
        mine = {k: v for a in actors.values() for k, v in a.residuals.items()}
        assert mine.keys() == reference.state.residuals.keys()
        assert all(same_bits(v, reference.state.residuals[k]) for k, v in mine.items()), step
        held.append({k: id(v) for a in actors.values() for k, v in buffers(a.residuals).items()})
    for step in range(WARMUP_SYNCS, len(held)):
        assert held[step] == held[step - 2], step
    assert not set(held[4].values()) & set(held[3].values())


def test_a_rollback_restores_the_residuals_and_the_next_step_reuses_the_voided_ones():
    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, bucket_bytes=600, strategy="ring")
    actors = sync_actors(plan)
    for step in range(3):
        run(actors, step, flatten_worker_grads(plan, make_grads(SHAPES, 3, seed=step))[0])
    before = {name: dict(a.residuals) for name, a in actors.items()}
    run(actors, 3, flatten_worker_grads(plan, make_grads(SHAPES, 3, seed=3))[0])
    voided = {id(v) for a in actors.values() for v in buffers(a.residuals).values()}
    for actor in actors.values():
        actor.rollback()
    for name, actor in actors.items():
        assert actor.residuals.keys() == before[name].keys()
        assert all(same_bits(actor.residuals[k], v) for k, v in before[name].items()), name
    run(actors, 4, flatten_worker_grads(plan, make_grads(SHAPES, 3, seed=4))[0])
    assert {id(v) for a in actors.values() for v in buffers(a.residuals).values()} == voided
