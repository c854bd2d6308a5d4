"""How much CPU DGC's keepers take per step in the DDP hook for the image task's gradient, in one process.

    python benchmarks/probes/keepers_cpu.py [--reps 40]

Question (issue #43): what do local clipping + momentum correction (``LocalKeepers.apply``) and momentum-factor
masking (``LocalKeepers.finish``) cost a rank on the image task's 3.3 M gradient floats, with a top-k 1 % residual?
Run it from two checkouts (say, before and after a change) alternately: it imports ``casync`` from the current
directory.  Prints the thread CPU per call (median of ``--reps``) as one JSON line.  The answer is in
``benchmarks/results/time_to_accuracy/topk_step_breakdown/``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()

    import numpy as np
    import torch

    import casync
    from casync.tasks.image import build_model
    from casync.torch.keepers import KeeperOptions, LocalKeepers

    torch.set_num_threads(1)

    class Shape:  # the image task's model on 28x28 images, without loading the data set
        x_train = np.zeros((1, 28, 28), np.uint8)
        classes = 10

    params = dict(build_model(Shape, 0).named_parameters())
    plan = casync.build_plan([(n, tuple(p.shape)) for n, p in params.items()], workers=4, strategy="allgather",
                             codec="topk:ratio=0.01", error_feedback=True, bucket_bytes=64 << 20)
    keepers = LocalKeepers(KeeperOptions(dgc_clip_norm=24.0, momentum_correction=0.9, momentum_masking=True),
                           params, 4)
    rng = np.random.default_rng(0)
    total = sum(p.numel() for p in params.values())
    flat = torch.from_numpy(rng.standard_normal(total).astype(np.float32) * 1e-3)
    residuals = {}
    for b in plan.buckets:
        r = rng.standard_normal(b.numel).astype(np.float32)
        r[rng.choice(b.numel, b.numel // 100, replace=False)] = 0.0
        residuals[f"worker:0/{b.name}/0"] = r
    views, at = [], 0
    for name, p in params.items():
        views.append((name, flat[at:at + p.numel()].view(p.shape)))
        at += p.numel()
    apply, finish = [], []
    with torch.no_grad():
        for _ in range(args.reps + 3):
            t0 = time.thread_time()
            keepers.apply(views)
            t1 = time.thread_time()
            keepers.finish(False, residuals, "worker:0", plan)
            t2 = time.thread_time()
            apply.append(t1 - t0)
            finish.append(t2 - t1)
    print(json.dumps({"casync": os.path.dirname(casync.__file__), "floats": total,
                      "apply_ms": round(statistics.median(apply[3:]) * 1e3, 2),
                      "finish_ms": round(statistics.median(finish[3:]) * 1e3, 2)}))


if __name__ == "__main__":
    main()
