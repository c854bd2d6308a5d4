"""What every casync actor tells about its own process: its node, pid, CPU time and threads.

The engines ping actors through ``pid`` (a dead process fails the call), calibration reads ``cpu_seconds``
around syncs, and ``benchmarks/sync_window_cpu.py`` names the threads it finds in ``/proc`` by
``thread_names``.
"""
from __future__ import annotations

import os
import threading
import time

import ray


class ActorProcess:
    """Mixed into an actor class: introspection of the process it runs in."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def cpu_seconds(self) -> float:
        """CPU seconds this actor's process has used so far, all threads (calibration reads it around syncs)."""
        return time.process_time()

    def thread_names(self) -> dict[int, str]:
        """Native thread id -> name of this process's Python threads (to tell its threads apart in /proc)."""
        return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}

    def call_thread(self) -> int:
        """Native id of the thread Ray runs this actor's default-group calls in (``MainThread``, or a thread
        Ray started, which Python names ``Dummy-N``, where the actor has concurrency groups)."""
        return threading.get_native_id()
