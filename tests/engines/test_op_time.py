"""Where an op's wall time goes: its own CPU, waiting for a core (schedstat), or blocked (the GIL)."""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time

import pytest

from casync.engines.inputs import flatten_worker_grads
from casync.engines.threadclock import run_queue_wait
from casync.engines.timeline import op_rows, op_time_split
from casync.transport.base import LocalHub
from tests.engines.test_executor import SlowOneBit, _many_buckets_plan, executors, run_step
from tests.helpers import make_grads

linux = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(os, "sched_setaffinity"),
                           reason="schedstat and CPU affinity are Linux's")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@linux
def test_a_thread_sharing_its_core_with_a_busy_process_counts_the_wait():
    """Pinned to one core beside a process that spins there too, a thread that spins 0.4 s of wall time waits a
    good part of it runnable; the counter says so."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    ctx = multiprocessing.get_context("fork")
    busy = ctx.Process(target=_spin, args=(3.0,), daemon=True)
    try:
        os.sched_setaffinity(0, {cpu})
        busy.start()
        os.sched_setaffinity(busy.pid, {cpu})
        time.sleep(0.05)
        start = run_queue_wait()
        _spin(0.4)
        waited = run_queue_wait() - start
    finally:
        busy.kill()
        busy.join()
        os.sched_setaffinity(0, before)
    assert 0.05 < waited < 0.4


@linux
def test_each_thread_reads_its_own_counter_and_closes_it_when_it_ends():
    fds = len(os.listdir("/proc/self/fd"))
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(run_queue_wait())) for _ in range(20)]
    for t in threads:
        t.start()
        t.join()
    assert len(seen) == 20 and all(isinstance(s, float) and s >= 0 for s in seen)
    assert len(os.listdir("/proc/self/fd")) == fds  # one descriptor per live thread, none left behind


def test_the_split_sums_each_actors_ops_and_leaves_receives_out():
    rows = [dict(op="encode", actor="worker:0", start=0.0, end=0.010, cpu=0.006, queued=0.003),
            dict(op="send", actor="worker:0", start=0.010, end=0.012, cpu=0.001, queued=0.0),
            dict(op="recv", actor="worker:0", start=0.0, end=0.5, cpu=0.0, queued=None),
            dict(op="backward", actor="worker:0", start=0.0, end=0.5, cpu=None, queued=None),
            dict(op="merge", actor="worker:1", start=0.0, end=0.004, cpu=0.004, queued=0.0)]
    split = op_time_split(rows)
    assert split == pytest.approx({"ops": 1.5, "wall": 0.008, "cpu": 0.0055, "queued": 0.0015, "blocked": 0.001})
    rows[0]["queued"] = None  # a record from a system that does not say
    assert op_time_split(rows) is None
    assert op_time_split([rows[2]]) is None


@linux
def test_an_op_that_sleeps_is_blocked_and_one_that_computes_is_not():
    """The executor's records: a codec whose encode sleeps (as an op waiting for the GIL would) shows that time
    as blocked, neither CPU nor waiting for a core."""
    plan, shapes = _many_buckets_plan(SlowOneBit(0.03))
    flats, _ = flatten_worker_grads(plan, make_grads(shapes, 2))
    execs = executors(plan, LocalHub(timeout_s=10))
    got, errors = run_step(plan, execs, {a: {} for a in plan.actors}, 0, flats)
    assert not errors
    rows = op_rows(0, {a: ex._records for a, ex in execs.items()})
    encodes = [r for r in rows if r["op"] == "encode"]
    assert encodes and all(r["queued"] is not None and r["cpu"] + r["queued"] <= r["end"] - r["start"] + 1e-3
                           for r in rows if r["op"] != "recv")
    for r in encodes:
        assert r["end"] - r["start"] - r["cpu"] - r["queued"] >= 0.025  # the sleep
    split = op_time_split(rows)
    assert split["blocked"] >= 0.025 * len(encodes) / len({r["actor"] for r in rows})
