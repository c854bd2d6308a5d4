"""How long a RayEngine takes to start and to close, per transport, measured side by side on this machine.

    python benchmarks/engine_start.py [--transports direct,gloo,objectstore] [--model resnet50]
                                      [--workers 4] [--rounds 3] [--out benchmarks/results/engine_start]

Each round starts and closes one engine per transport, in turn (the machine's load spreads over all of them),
on an embedded local Ray that is already up; *start* is ``RayEngine(plan)`` returning ready to sync (actors
placed, started, data plane formed), *first sync* the first ``sync`` after it (gradients made on the driver,
not counted).  On one machine the direct transport needs no process group, so its actors never import torch;
``gloo`` forms one (torch imported in every actor).
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

import numpy as np

from casync.table import markdown_table
from result_files import write_results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transports", default="direct,gloo,objectstore")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/engine_start")
    args = p.parse_args(argv)
    import casync
    from casync.datasets.gradients import model_shapes
    from casync.runtime.ray_engine import RayEngine
    from casync.runtime.ray_layer import connect_ray

    words = [os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])
    command = "python " + " ".join(shlex.quote(a) for a in words)
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    plan = casync.build_plan(args.model, workers=args.workers, strategy="ring", codec="onebit")
    rng = np.random.default_rng(0)
    grads = [{name: rng.standard_normal(shape).astype(np.float32) for name, shape in model_shapes(args.model)}
             for _ in range(args.workers)]
    connect_ray(None)
    times: dict[str, dict[str, list[float]]] = {t: {"start": [], "first sync": [], "close": []} for t in transports}
    for round_ in range(args.rounds):
        for transport in transports:
            t0 = time.perf_counter()
            engine = RayEngine(plan, transport=transport)
            t1 = time.perf_counter()
            engine.sync(grads)
            t2 = time.perf_counter()
            engine.close()
            t3 = time.perf_counter()
            for key, value in (("start", t1 - t0), ("first sync", t2 - t1), ("close", t3 - t2)):
                times[transport][key].append(value)
            print(f"round {round_ + 1}: {transport}: start {t1 - t0:.2f} s, first sync {t2 - t1:.2f} s", flush=True)
    rows = [[t] + [f"{statistics.median(v[k]):.2f} ({min(v[k]):.2f}-{max(v[k]):.2f})"
                   for k in ("start", "first sync", "close")] for t, v in times.items()]
    text = (f"# RayEngine start-up per transport\n\n`{command}`\n\n{args.model}, {args.workers} workers, ring/onebit "
            f"({len(plan.actors)} actors), {args.rounds} rounds; median (min-max) seconds.\n\n"
            + markdown_table(["transport", "start", "first sync", "close"], rows) + "\n")
    md = write_results(args.out, "engine_start", text, dict(command=command, times=times, date=time.ctime()))
    print(text)
    print(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
