"""What a second compute thread per actor buys (``RayEngine(compute_threads=2)``), measured on this machine.

    python benchmarks/compute_threads.py [--codecs onebit,randomk:ratio=0.01,topk:ratio=0.01]
                                         [--configs ring/onebit,ps-twoway/randomk:ratio=0.01,ring/none]
                                         [--workers 2] [--rounds 2] [--out benchmarks/results/compute_threads]

Two measurements, side by side in one run:

* **ops**: four error-feedback encodes of a ResNet-50-sized partition (6.4M floats) in one thread, then
  two threads taking two each (best of 5): how far NumPy's kernels overlap when two cores are free (they
  release the GIL inside each array loop, not between the calls of a sweep, and share memory bandwidth);
* **engine**: RayEngine's sync span (first op to last op, gradients already in the actors, median of 5
  syncs per engine and round) with ``compute_threads`` 1 and 2, alternating, ``--workers`` actors.

The simulator's ``ClusterModel(compute_lanes=2)`` counts a second lane as a second core: the *ops* ratio says
how much of that an actor gets.  On a machine whose cores are all taken by actors already, the *engine* rows
show what extra threads cost there (which is why the default is 1).
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import numpy as np

from casync.table import markdown_table
from result_files import write_results

PARTITION = 6_400_000  # a quarter of ResNet-50's 25.6M floats


def op_overlap(codec_spec: str, repeats: int = 5) -> dict:
    """Best wall time of four EF encodes one after another, and split over two threads."""
    from casync.primitives.codecs import get_codec

    codec = get_codec(codec_spec)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(PARTITION).astype(np.float32) for _ in range(4)]
    residuals = [rng.standard_normal(PARTITION).astype(np.float32) for _ in range(4)]

    def encode(i: int) -> None:
        codec.encode_feedback(xs[i], residuals[i], i)

    for i in range(4):  # warm: scratch buffers, pages
        encode(i)
    one = two = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(4):
            encode(i)
        one = min(one, time.perf_counter() - start)
        threads = [threading.Thread(target=lambda j=j: [encode(i) for i in (2 * j, 2 * j + 1)]) for j in range(2)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        two = min(two, time.perf_counter() - start)
    return dict(codec=codec_spec, one_thread_s=one, two_threads_s=two, speedup=one / two)


def engine_spans(configs: list[str], workers: int, rounds: int, syncs: int = 5) -> dict:
    """Median sync span per (configuration, compute_threads), the two settings alternating every round."""
    import ray

    import casync
    from casync.bench.measure import sync_span
    from casync.datasets.gradients import model_shapes
    from casync.runtime.ray_engine import RayEngine

    ray.init(num_cpus=max(4, workers), include_dashboard=False, object_store_memory=1 << 30)
    rng = np.random.default_rng(0)
    grads = [{n: rng.standard_normal(s).astype(np.float32) for n, s in model_shapes("resnet50")}
             for _ in range(workers)]
    spans: dict[tuple[str, int], list[float]] = {}
    try:
        for _ in range(rounds):
            for config in configs:
                strategy, codec = config.split("/", 1)
                kw = dict(strategy="ps", two_way=True) if strategy == "ps-twoway" else dict(strategy=strategy)
                plan = casync.build_plan("resnet50", workers=workers, codec=codec, **kw)
                for threads in (1, 2):
                    with RayEngine(plan, address="auto", compute_threads=threads) as engine:
                        for _ in range(syncs + 1):
                            engine.sync(grads)
                        spans.setdefault((config, threads), []).extend(
                            sync_span(engine.timeline(step)) for step in range(1, syncs + 1))
    finally:
        ray.shutdown()
    return {f"{c}|{t}": v for (c, t), v in spans.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codecs", default="onebit,randomk:ratio=0.01,topk:ratio=0.01")
    parser.add_argument("--configs", default="ring/onebit,ps-twoway/randomk:ratio=0.01,ring/none")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/compute_threads")
    args = parser.parse_args()
    started, load = time.time(), os.getloadavg()
    ops = [op_overlap(c) for c in args.codecs.split(",")]
    configs = args.configs.split(",")
    spans = engine_spans(configs, args.workers, args.rounds)
    op_rows = [[o["codec"], round(o["one_thread_s"] * 1e3, 1), round(o["two_threads_s"] * 1e3, 1),
                round(o["speedup"], 2)] for o in ops]
    engine_rows = []
    for config in configs:
        one, two = (statistics.median(spans[f"{config}|{t}"]) for t in (1, 2))
        engine_rows.append([config, round(one * 1e3, 1), round(two * 1e3, 1), round(one / two, 2)])
    command = (f"python benchmarks/compute_threads.py --codecs {args.codecs} --configs {args.configs} "
               f"--workers {args.workers} --rounds {args.rounds}")
    text = (f"# A second compute thread per actor\n\nGenerated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
            f"in {time.time() - started:.0f} s by\n\n```\n{command}\n```\n\n"
            f"Machine: {os.cpu_count()} cores, load average at start {[round(x, 2) for x in load]}. See the "
            "script's docstring for what is timed.\n\n## Ops: four error-feedback encodes of 6.4M floats\n\n"
            + markdown_table(["codec", "one thread ms", "two threads ms", "speed-up"], op_rows)
            + f"\n\n## Engine: RayEngine, ResNet-50, {args.workers} workers on this machine\n\n"
            + markdown_table(["configuration", "compute_threads=1 span ms", "compute_threads=2 span ms",
                              "speed-up"], engine_rows) + "\n")
    md = write_results(args.out, "compute_threads", text, dict(command=command, ops=ops, spans=spans))
    print(text)
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
