"""The CPU-accounting benchmarks' pieces: benchmarks/sync_window_cpu.py's thread roles, samples around a span
and busy processes; benchmarks/trainer_cpu.py's thread labels and /proc snapshots.  The scripts themselves run
RayEngine and the Trainer (see their results under benchmarks/results/sync_window_cpu_* and trainer_cpu)."""
from __future__ import annotations

import os
import threading
import time

from tests.helpers import load_benchmark

load_benchmark("result_files")  # what the script imports as a sibling
swc = load_benchmark("sync_window_cpu")
tcpu = load_benchmark("trainer_cpu")


def test_thread_roles_leave_the_peers_out():
    assert swc.thread_role("casync-send-worker:0->worker:13") == "casync-send-#->#"
    assert swc.thread_role("casync-socket-server:1<-worker:2") == "casync-socket-#<-#"
    assert swc.thread_role("MainThread") == "MainThread"


def test_samples_bracket_a_span_and_a_busy_process_is_found():
    me = os.getpid()

    def burn() -> None:
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass

    busy = swc.busy_processes(burn)
    assert busy.get(me, "").startswith("python")
    with swc.Sampler({me: "me"}, {me: me}, period_s=0.005) as sampler:
        time.sleep(0.03)
        start = time.time()
        burn()
        end = time.time()
        time.sleep(0.03)
    (t0, m0, p0, th0), (t1, m1, p1, th1) = sampler.around(start, end)
    assert t0 <= start and t1 >= end and p1[me] >= p0[me] and len(m0) == len(swc.STAT_FIELDS)
    assert sampler.around(start - 3600, end) is None  # before the first sample: not covered


def test_trainer_threads_are_labelled_by_what_they_do():
    assert tcpu.thread_label("Dummy-1", is_call_thread=True) == tcpu.CALL_THREAD
    assert tcpu.thread_label("Dummy-3", is_call_thread=False) == tcpu.GROUP
    assert tcpu.thread_label("casync-sync-worker:2", False) == tcpu.ROLES["casync-sync-#"]
    assert tcpu.thread_label("casync-send-worker:0->worker:1", False) == tcpu.ROLES["casync-send-#->#"]
    assert tcpu.thread_label(None, False) == tcpu.OTHER
    assert tcpu.thread_label("MainThread", False) == "MainThread"


def test_a_snapshot_counts_this_process_and_its_threads():
    me = os.getpid()
    m0, p0, t0 = tcpu.snapshot([me])
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    m1, p1, t1 = tcpu.snapshot([me])
    assert p1[me] > p0[me] and (me, threading.get_native_id()) in t1
    assert t1[(me, threading.get_native_id())] > t0[(me, threading.get_native_id())]
    assert len(m1) == len(swc.STAT_FIELDS) and sum(m1) > sum(m0)
