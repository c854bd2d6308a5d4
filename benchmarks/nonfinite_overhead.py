"""What the NaN/Inf check costs: one pass over a gradient, next to one onebit encode of it.

Every sync scans each worker's flat gradient once (``casync.engines.nonfinite.scan_worker``: a summing pass, plus an
exact pass only when the sum is not finite).  Measured side by side on the same 25M-float array (ResNet-50's
size), best of ``--repeat``:

    python benchmarks/nonfinite_overhead.py [--n 25000000] [--repeat 7] [--model resnet50 --workers 4]

Writes ``benchmarks/results/nonfinite_overhead.md``.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from casync.engines.nonfinite import BucketLayout, scan_worker
from casync.primitives.codecs import get_codec
from casync.primitives.finite import all_finite


def best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=25_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--model", default="resnet50", help="also time a whole LocalEngine sync ('' to skip)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results/nonfinite_overhead.md")
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal(args.n).astype(np.float32)
    bad = x.copy()
    bad[args.n // 2] = np.inf
    layout = [BucketLayout("bucket0", ("t0", "t1"), (args.n // 2, args.n), (args.n // 4, args.n // 2, args.n))]
    onebit = get_codec("onebit")
    rows = [
        ("onebit encode (reference)", best(lambda: onebit.encode(x), args.repeat)),
        ("all_finite (summing pass), finite input", best(lambda: all_finite(x), args.repeat)),
        ("np.isfinite(x).all(), for comparison", best(lambda: np.isfinite(x).all(), args.repeat)),
        ("scan_worker, finite gradient (what every sync pays)", best(lambda: scan_worker(layout, 0, {"bucket0": x}),
                                                                     args.repeat)),
        ("scan_worker, one Inf (counts and names it)", best(lambda: scan_worker(layout, 0, {"bucket0": bad}),
                                                            args.repeat)),
        ("x.copy(), memory bandwidth", best(lambda: x.copy(), args.repeat)),
    ]
    reference = rows[0][1]
    engine_rows = []
    if args.model:
        import casync
        from casync.engines.inputs import flatten_worker_grads
        from casync.engines.nonfinite import layouts

        plan = casync.build_plan(args.model, workers=args.workers, strategy="ring", codec="onebit")
        rng = np.random.default_rng(1)
        grads = [{t.name: rng.standard_normal(t.shape).astype(np.float32) for t in plan.tensors}
                 for _ in range(args.workers)]
        flats, _ = flatten_worker_grads(plan, grads)
        engine = casync.LocalEngine(plan)
        lay = layouts(plan)
        sync_s = best(lambda: engine.run_flat(flats), max(1, args.repeat // 3))
        scan_s = best(lambda: [scan_worker(lay, w, flats[w]) for w in range(args.workers)], args.repeat)
        engine_rows = [(f"LocalEngine.run_flat, {args.model}, {args.workers} workers, ring + onebit", sync_s),
                       (f"of which the {args.workers} gradient scans", scan_s)]
    lines = [f"# NaN/Inf check cost on {args.n:,} float32 ({4 * args.n / 2**20:.0f} MiB)", "",
             f"Best of {args.repeat}, one process, {os.cpu_count()} CPUs. Command: "
             f"`python benchmarks/nonfinite_overhead.py --n {args.n} --repeat {args.repeat}`.", "",
             "| operation | ms | relative to onebit encode |", "|---|---|---|"]
    lines += [f"| {name} | {t * 1e3:.2f} | {t / reference:.2f} |" for name, t in rows]
    if engine_rows:
        (label, sync_s), (scan_label, scan_s) = engine_rows
        lines += ["", "| whole sync | ms | share |", "|---|---|---|", f"| {label} | {sync_s * 1e3:.1f} | 100% |",
                  f"| {scan_label} | {scan_s * 1e3:.1f} | {100 * scan_s / sync_s:.1f}% |"]
    lines += ["", "A sync scans each worker's gradient once (driver side for `sync()`, in the actor for gradients "
                  "handed over as ObjectRefs); encodes re-check only partitions known to hold NaN/Inf."]
    text = "\n".join(lines)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
