"""Fault injection for the fault tests: a codec that pauses mid-sync on demand, and Ray bookkeeping probes.

Ray workers cannot import the tests directory, so this module is pickled by value (see ``register``).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from casync.primitives.codecs.sign import OneBitCodec


class GatedOneBit(OneBitCodec):
    """``onebit`` whose encode waits while the file ``gate`` exists (after touching ``gate + ".waiting"``).

    Bit-identical to onebit; with the gate file present, a sync stops with its tasks in flight, which is
    where the fault tests kill an actor, remove a node or let the engine time out.
    """

    name = "gated-onebit"

    def __init__(self, gate: str):
        self.gate = gate

    def params(self) -> dict:
        return {"gate": self.gate}

    def encode(self, x, seed=0):
        if os.path.exists(self.gate):
            Path(self.gate + ".waiting").touch()
            while os.path.exists(self.gate):
                time.sleep(0.005)
        return super().encode(x, seed)


def register() -> None:
    """Ship this module's classes to Ray workers by value."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def when_paused(gate: Path, action: Callable[[], None], release: bool = True, timeout_s: float = 120.0) -> dict:
    """In a thread: once some actor waits at ``gate``, run ``action`` (the fault), then remove the gate (so the
    survivors run on into the failure) unless ``release`` is False.  Returns a dict that gets ``t_fault``."""
    info: dict = {}
    waiting = Path(str(gate) + ".waiting")

    def run() -> None:
        deadline = time.monotonic() + timeout_s
        while not waiting.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        info["t_fault"] = time.monotonic()
        try:
            action()
        finally:
            if release:
                gate.unlink(missing_ok=True)

    info["thread"] = threading.Thread(target=run, daemon=True)
    info["thread"].start()
    return info


def alive_actors() -> int:
    """Actors the GCS lists as ALIVE (any job)."""
    import ray

    return sum(a["State"] == "ALIVE" for a in ray._private.state.actors().values())


def live_placement_groups() -> int:
    import ray

    return sum(pg["state"] != "REMOVED" for pg in ray.util.placement_group_table().values())
