"""The per-rank executor's own cost per op, and one ResNet-50 step's CPU: four executors in threads of one process
over a LocalHub (no sockets), so what is measured is the ops and the executor around them.

    PYTHONPATH=<checkout> python overhead.py [--steps 12] [--threads 1]

* many small ops: 64 tensors of 4096 floats, one bucket each, ring/onebit with 4 partitions (6,656 ops per step
  over the four actors): the kernel's work is small, so CPU per op is mostly the executor's and the codec's Python;
* ResNet-50 ring/onebit with 8 partitions: the process's CPU per step (about 200 ops per actor).

Run from a checkout (the test helpers build the executors); the commit under test is whichever ``casync`` the
path gives.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import casync
from casync.schedule import actor_shares
from casync.transport.base import LocalHub
from tests.engines.test_executor import executors, run_step


def steps(plan, n: int, threads: int) -> tuple[float, float]:
    """Median (CPU s, wall s) per step of ``plan`` on four executors, after 4 warm-up steps."""
    rng = np.random.default_rng(0)
    flats = [{b.name: rng.standard_normal(b.numel).astype(np.float32) for b in plan.buckets} for _ in range(4)]
    execs = executors(plan, LocalHub(timeout_s=60), compute_threads=threads)
    residuals = {a: {} for a in plan.actors}
    cpu, wall = [], []
    for step in range(n + 4):
        c0, w0 = time.process_time(), time.perf_counter()
        _, errors = run_step(plan, execs, residuals, step, flats)
        assert not errors, errors
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu[4:]), statistics.median(wall[4:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    shapes = {f"t{i}": (4096,) for i in range(64)}
    small = casync.build_plan(shapes, workers=4, strategy="ring", codec="onebit", partitions=4, bucket_bytes=4 * 4096)
    ops = sum(len(actor_shares(small)[a].ops) for a in small.actors)
    cpu, wall = steps(small, args.steps, args.threads)
    print(f"{casync.__file__}: many small ops ({ops} per step): CPU per op {1e6 * cpu / ops:.0f} us, "
          f"wall per step {1e3 * wall:.1f} ms")
    big = casync.build_plan("resnet50", workers=4, strategy="ring", codec="onebit", partitions=8)
    cpu, wall = steps(big, args.steps, args.threads)
    print(f"{casync.__file__}: resnet50 ring.p8/onebit: CPU per step {1e3 * cpu:.1f} ms, wall per step "
          f"{1e3 * wall:.1f} ms")


if __name__ == "__main__":
    main()
