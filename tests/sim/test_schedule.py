"""Fusing a plan into per-actor tasks (Ray-free): coverage, acyclicity and a submittable order."""
from __future__ import annotations

import pytest

import casync
from casync.schedule import compile_program


@pytest.mark.parametrize("strategy,extra", [("ring", {}), ("allgather", {}), ("ps", {}), ("ps", {"servers": 2})])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_tasks_cover_plan_in_a_submittable_order(strategy, extra, workers):
    plan = casync.build_plan("resnet50", workers=workers, strategy=strategy, codec="onebit", **extra)
    program = compile_program(plan)
    seen = [n for t in program.tasks for n in t.nodes]
    assert sorted(seen) == sorted(plan.graph.nodes)  # every op in exactly one task
    position = {t.id: i for i, t in enumerate(program.tasks)}
    assert list(position.values()) == [t.id for t in program.tasks]
    for task in program.tasks:
        assert {plan.graph.nodes[n]["actor"] for n in task.nodes} == {task.actor}
        assert {plan.graph.nodes[n]["bucket"] for n in task.nodes} == {task.bucket}
        for u in task.remote_inputs:  # produced by an earlier-submitted task on another actor, by a send
            producer, _ = program.producer[u]
            assert position[producer] < position[task.id]
            assert plan.graph.nodes[u]["op"] == "send" and program.tasks[producer].actor != task.actor
        for before in task.after:
            assert position[before] < position[task.id] and program.tasks[before].actor == task.actor
    # fusion pays: far fewer remote calls than ops
    assert len(program.tasks) * 2 < plan.graph.number_of_nodes() or workers == 1


def test_earlier_ready_buckets_are_submitted_first():
    plan = casync.build_plan("resnet50", workers=4, strategy="ring", codec="onebit", bucket_bytes=4 << 20)
    program = compile_program(plan)
    first_round = [t.priority for t in program.tasks if t.round == 0]
    assert first_round == sorted(first_round)
