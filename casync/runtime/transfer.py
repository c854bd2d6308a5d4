"""The actor-to-actor transfer cost through Ray's object store on this node (``casync profile``'s Ray part)."""
from __future__ import annotations

import time
from typing import Iterable

import numpy as np
import ray

from ..sim.profiler import best_time, fit_linear
from .ray_layer import connect_ray


def profile_transfer(sizes: Iterable[int] = (2**10, 2**16, 2**20, 2**23, 2**25), repeat: int = 3) -> tuple[float, float, float]:
    """``(alpha_s, beta_bytes_per_s, task_overhead_s)`` between two Ray actors on this node."""
    started = connect_ray(None)
    try:
        @ray.remote(num_cpus=0)
        class Box:
            def hold(self, nbytes: int) -> None:
                self.buf = np.ones(nbytes, np.uint8)

            def give(self) -> np.ndarray:  # returning it copies it into the object store, as a send does
                return self.buf

            def take(self, payload: np.ndarray) -> int:
                return int(payload[-1]) if payload.size else 0

            def nop(self) -> None:
                return None

        a, b = Box.remote(), Box.remote()
        ray.get([a.nop.remote(), b.nop.remote()])
        calls = 200
        t0 = time.perf_counter()
        ray.get([a.nop.remote() for _ in range(calls)])
        overhead = (time.perf_counter() - t0) / calls
        secs = []
        for nbytes in sizes:
            ray.get(a.hold.remote(nbytes))
            secs.append(best_time(lambda: ray.get(b.take.remote(a.give.remote())), repeat))
        fit = fit_linear(sizes, secs)
        for h in (a, b):
            ray.kill(h)
        return fit.a, (1.0 / fit.b if fit.b > 0 else 1e12), overhead
    finally:
        if started:
            ray.shutdown()
