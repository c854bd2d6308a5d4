"""Per-rank gradient norms of a task's uncompressed run: where DGC's local clipping threshold should sit (issue #43).

    python benchmarks/grad_norms.py [--task image] [--data PATH] [--ranks 4] [--steps 400] [--seed 0]
                                    [--out benchmarks/results/time_to_accuracy/tuning]

DGC clips each worker's gradient to ``dgc_clip_norm * N^-1/2`` before accumulation.  A task trained without
clipping has no threshold to reuse, so this measures what the clip would cut: it trains the task's model as DDP
allreduce does (the mean of ``--ranks`` ranks' gradients, each rank's own batches, the task's tuned learning rate
and batch size), in one process, and records every rank's gradient L2 norm per step.  The report gives the norms'
quantiles by phase and the ``dgc_clip_norm`` at which the local threshold clips 10 % and 1 % of them.
"""
from __future__ import annotations

import argparse
import json

import numpy as np


def measure(task_name: str, ranks: int, steps: int, seed: int, data: str | None = None) -> np.ndarray:
    """``norms[step, rank]``: each rank's gradient L2 norm along the uncompressed (mean of ranks) trajectory."""
    import torch

    from casync.tasks import get_task

    torch.set_num_threads(1)
    task = get_task(task_name)
    data = task.load(data)
    model = task.model(data, seed)
    params = list(model.parameters())
    optimizer = task.optimizer(params, task.defaults["lr"])
    streams = [task.batches(data, r, ranks, task.defaults["batch_size"], seed) for r in range(ranks)]
    norms = np.zeros((steps, ranks))
    for step in range(steps):
        total = [torch.zeros_like(p) for p in params]
        for rank, stream in enumerate(streams):
            inputs, targets = next(stream)
            model.zero_grad(set_to_none=True)
            task.loss(model, inputs, targets).backward()
            norms[step, rank] = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params])))
            for t, p in zip(total, params):
                t.add_(p.grad)
        for t, p in zip(total, params):
            p.grad = t / ranks
        optimizer.step()
    return norms


def report(norms: np.ndarray, task: str, seed: int) -> tuple[str, dict]:
    steps, ranks = norms.shape
    phases = [(0, steps // 8), (steps // 8, steps // 2), (steps // 2, steps), (0, steps)]
    lines = [f"# Per-rank gradient norms, task {task}, {ranks} ranks, {steps} steps, seed {seed}", "",
             f"`python benchmarks/grad_norms.py --task {task} --ranks {ranks} --steps {steps} --seed {seed}`", "",
             "| steps | median | p90 | p99 | max |", "|---|---:|---:|---:|---:|"]
    raw: dict = {"task": task, "ranks": ranks, "steps": steps, "seed": seed, "phases": []}
    for lo, hi in (ph for ph in phases if ph[1] > ph[0]):  # (a run of under 8 steps has no first phase)
        part = norms[lo:hi].ravel()
        q = {k: float(np.percentile(part, p)) for k, p in (("median", 50), ("p90", 90), ("p99", 99), ("max", 100))}
        raw["phases"].append({"steps": [lo, hi], **q})
        lines.append(f"| {lo}–{hi} | {q['median']:.2f} | {q['p90']:.2f} | {q['p99']:.2f} | {q['max']:.2f} |")
    scale = ranks ** 0.5  # the local threshold is dgc_clip_norm / sqrt(N)
    clip = {f"clips_{p}pct": float(np.percentile(norms, 100 - p) * scale) for p in (10, 1)}
    raw.update(clip, norms=norms.tolist())
    lines += ["", f"`dgc_clip_norm` whose local threshold (÷ √{ranks}) clips 10 % of these norms: "
              f"{clip['clips_10pct']:.1f}; 1 %: {clip['clips_1pct']:.1f}."]
    return "\n".join(lines) + "\n", raw


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="image")
    p.add_argument("--data", default=None, help="the task's data elsewhere (default: the task's own)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for grad_norms_<task>.md/.json (default: print only)")
    args = p.parse_args(argv)
    text, raw = report(measure(args.task, args.ranks, args.steps, args.seed, args.data), args.task, args.seed)
    print(text)
    if args.out:
        from result_files import write_results

        write_results(args.out, f"grad_norms_{args.task}", text, raw)


if __name__ == "__main__":
    main()
