"""The executor's long-lived threads: one per peer and direction, each running the calls handed to it in order.

Starting a thread waits until it runs (a millisecond or more on busy cores), so a :class:`Lane` is started once and
takes every step's sends to (or receives from) its peer from a queue.
"""
from __future__ import annotations

import queue
import threading
from typing import Any


class Lane:
    """A daemon thread that runs the calls handed to it one after another; the executor keeps one per peer and
    direction for all its steps.  Each call's event is set when it returns (the calls catch their own errors)."""

    def __init__(self, name: str):
        self.name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._last = threading.Event()
        self._last.set()
        threading.Thread(target=self._loop, args=(self._calls,), daemon=True, name=name).start()

    def run(self, fn: Any, *args: Any) -> threading.Event:
        done = self._last = threading.Event()
        self._calls.put((fn, args, done))
        return done

    def idle(self) -> bool:
        """Whether every call handed over has returned."""
        return self._last.is_set()

    def stop(self) -> None:
        self._calls.put(None)

    @staticmethod
    def _loop(calls: queue.SimpleQueue) -> None:  # holds no reference to the Lane: an unused one can be collected
        while True:
            item = calls.get()
            if item is None:
                return
            fn, args, done = item
            del item
            try:
                fn(*args)
            finally:
                del fn, args  # no reference to the executor between steps
                done.set()


def stop_lanes(lanes: dict[Any, Lane]) -> None:
    for lane in lanes.values():
        lane.stop()
