"""Quickstart: build a sync plan for a small torch model, look at it, and run it on the LocalEngine.

    python examples/quickstart.py [--out DIR]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import casync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=".", help="where to write plan.png and plan.dot")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    plan = casync.build_plan(model, workers=args.workers, strategy="ring", codec="onebit", bucket_bytes=64 << 10)
    print(plan.summary())
    print()
    print(plan.table(plan.buckets[0].name).splitlines()[0], "...")  # one row per op, like torch.fx
    (out / "plan.dot").write_text(plan.to_dot(plan.buckets[0].name))
    plan.draw(str(out / "plan.png"), bucket=plan.buckets[0].name)
    print(f"\nwrote {out / 'plan.dot'} and {out / 'plan.png'}")

    # one gradient set per worker: run a real backward pass on different random batches
    grads = []
    for rank in range(args.workers):
        torch.manual_seed(rank)
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})

    engine = casync.LocalEngine(plan)
    synced = engine.sync(grads)
    exact = {n: torch.stack([g[n] for g in grads]).mean(0) for n in grads[0]}
    err = sum(float((synced[0][n] - exact[n]).norm() ** 2) for n in exact) ** 0.5
    ref = sum(float(v.norm() ** 2) for v in exact.values()) ** 0.5
    same = all(torch.equal(synced[0][n], s[n]) for s in synced for n in exact)
    print(f"synced {len(exact)} tensors on {args.workers} workers: relative error vs exact mean {err / ref:.3f} "
          f"(onebit, first step), replicas identical: {same}")
    print(f"error-feedback state: {len(engine.state_dict()['residuals'])} residuals, "
          f"{sum(r.size for r in engine.state_dict()['residuals'].values()):,} floats")
    assert same and isinstance(synced[0]["0.weight"], torch.Tensor)
    np.testing.assert_equal(synced[0]["4.bias"].shape, (10,))


if __name__ == "__main__":
    main()
