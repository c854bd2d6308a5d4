"""What moving a payload between two actors of one node costs, per data plane (``casync profile``'s part that
needs processes): ``alpha + bytes / beta`` seconds and the per-task overhead.

* ``"direct"``: the sender copies the body into the receiver's shared-memory slot (``beta``: that copy, into
  memory already mapped, cache-cold), then a small header crosses a Unix socket (``alpha``: its one-way
  latency; actors of one node form no process group); the overhead is the per-rank executor's own cost per
  task.
* ``"objectstore"``: a payload returned by one Ray actor and passed to another; the overhead is a Ray call.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from typing import Iterable

import numpy as np

from ..sim.profiler import CacheFlusher, best_time, fit_linear

SIZES = (2**10, 2**16, 2**20, 2**23, 2**25, 2**26)


def profile_transfer(sizes: Iterable[int] = SIZES, repeat: int = 3, transport: str = "direct"
                     ) -> tuple[float, float, float]:
    """``(alpha_s, beta_bytes_per_s, task_overhead_s)`` between two actors of this node on ``transport``."""
    if transport == "objectstore":
        return _objectstore(sizes, repeat)
    if transport != "direct":
        raise ValueError(f"transport must be 'direct' or 'objectstore', got {transport!r}")
    alpha = _header_latency()
    big = [n for n in sizes if n >= 2**23] or list(sizes)  # beyond the caches, as gradient payloads are
    cold = CacheFlusher().flush  # the arena slot was last written a step ago
    secs = []
    for nbytes in big:
        src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        dst[...] = src  # mapped and touched, as a reused arena slot is
        secs.append(best_time(lambda: dst.__setitem__(Ellipsis, src), repeat, cold))
    beta = max(big) / max(secs) if len(big) < 2 else 1.0 / max(fit_linear(big, secs).b, 1e-12)
    return alpha, beta, _executor_overhead()


def _ping(actor: str, prefix: str, rounds: int, listening: "mp.synchronize.Barrier", out: "mp.Queue") -> None:
    from ..transport.sockets import SocketChannel

    channel = SocketChannel(actor, ("a", "b"), prefix, timeout_s=60)
    listening.wait(60)  # both listen before either connects
    channel.connect()
    peer = "b" if actor == "a" else "a"
    header = np.zeros(4, np.int64)
    for i in range(rounds + 10):  # the first ten warm the connection up
        if i == 10:
            start = time.perf_counter()
        if actor == "a":
            channel.isend(header, peer, 1)
            channel.irecv(header, peer, 2).wait()
        else:
            channel.irecv(header, peer, 1).wait()
            channel.isend(header, peer, 2)
    if actor == "a":
        out.put((time.perf_counter() - start) / rounds / 2)
    channel.close()


def _header_latency(rounds: int = 300) -> float:
    """One-way latency of a header between two processes of this node over the direct plane's Unix sockets
    (half a round trip; no port is opened)."""
    ctx = mp.get_context("spawn")
    out, listening = ctx.Queue(), ctx.Barrier(2)
    prefix = f"casync-ping-{os.getpid()}-{time.monotonic_ns()}"
    procs = [ctx.Process(target=_ping, args=(actor, prefix, rounds, listening, out)) for actor in ("a", "b")]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                return float(out.get(timeout=0.2))
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"the header-latency probe's two processes gave no result (exit codes "
                                       f"{[p.exitcode for p in procs]}; a spawned process re-imports __main__, so "
                                       "run the profile from the casync command or a script file)") from None
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def _executor_overhead(tensors: int = 48, steps: int = 20) -> float:
    """The per-rank executor's cost per task beyond its ops: two actors in threads of this process run a plan
    of tiny tensors (ops of next to no work) over an in-process hub."""
    import threading

    from ..engines.executor import RankExecutor
    from ..build import build_plan
    from ..schedule import actor_shares, compile_program
    from ..transport.base import LocalHub

    plan = build_plan([(f"t{i}", (64,)) for i in range(tensors)], workers=2, strategy="ring", codec="none",
                      bucket_bytes=0)
    shares, hub = actor_shares(plan), LocalHub(timeout_s=60)
    parts = {b.name: list(b.partitions) for b in plan.buckets}
    executors = {a: RankExecutor(shares[a], plan.codecs, plan.seed, parts, hub.channel(a), 60) for a in plan.actors}
    grads = {b.name: np.zeros(b.numel, np.float32) for b in plan.buckets}

    def run(actor: str, step: int) -> None:
        executor = executors[actor]
        executor.begin(step, {})
        for bucket, flat in grads.items():
            executor.provide(bucket, flat)
        executor.finish()

    start = time.perf_counter()
    for step in range(steps):
        threads = [threading.Thread(target=run, args=(a, step)) for a in plan.actors]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    per_step = (time.perf_counter() - start) / steps
    return per_step / (len(compile_program(plan).tasks) / len(plan.actors))


def _objectstore(sizes: Iterable[int], repeat: int) -> tuple[float, float, float]:
    import ray

    from .ray_layer import connect_ray

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
