"""Train an MLP on scikit-learn's digits with casync.Trainer, once per codec, and compare.

    python examples/train_digits.py [--workers 4] [--steps 100] [--model mlp|mlp-deep] [--out out/train_digits]

Everything runs on an embedded local Ray.  Prints, per codec (none, onebit + error feedback, top-k 1% +
error feedback, and onebit without error feedback): held-out accuracy, time per step, synchronization
time and the fraction of it hidden behind backward, bytes on the wire; writes loss_vs_step.png, each run's
history as JSON, and the measured timeline of one onebit step.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import casync
from casync.datasets.digits import SGD, DigitsData, DigitsMLP, accuracy, cross_entropy
from casync.runtime.ray_layer import connect_ray
from casync.table import format_table

RUNS = [  # label, codec, error feedback
    ("none", None, True),
    ("onebit + EF", "onebit", True),
    ("topk 1% + EF", "topk:ratio=0.01", True),
    ("onebit, no EF", "onebit", False),
]


def plot(histories: dict, accuracies: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, history in histories.items():
        loss = np.array(history.column("loss"))
        smooth = np.convolve(loss, np.ones(5) / 5, mode="valid")  # 5-step moving average over the raw curve
        line, = ax.plot(range(2, 2 + len(smooth)), smooth, label=f"{label} (acc {accuracies[label]:.1%})",
                        linestyle="--" if "no EF" in label else "-")
        ax.plot(history.column("step"), loss, color=line.get_color(), alpha=0.2, linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over workers)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--model", default="mlp", help="mlp (64-2048-2048-10) | mlp-deep (64-1024x4-10)")
    parser.add_argument("--strategy", default="ring")
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--out", default="out/train_digits")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import ray

    started = connect_ray(None, num_cpus=max(os.cpu_count() or 1, args.workers))  # one embedded Ray for all runs
    model_fn = DigitsMLP.named(args.model)
    params = sum(p.numel() for p in model_fn().parameters())
    histories, accuracies, rows = {}, {}, []
    for label, codec, error_feedback in RUNS:
        with casync.Trainer(model_fn, SGD(lr=args.lr), cross_entropy, DigitsData(batch_size=args.batch_size),
                            workers=args.workers, strategy=args.strategy, codec=codec, error_feedback=error_feedback,
                            progress=not args.no_progress) as trainer:
            history = trainer.fit(steps=args.steps)
            accuracies[label] = accuracy(trainer.model())
            if codec == "onebit" and error_feedback:
                trainer.draw_timeline(str(out / "timeline_onebit.png"), step=trainer.step - 1)
        histories[label] = history
        slug = label.replace(" ", "_").replace("%", "pct").replace(",", "").replace("+", "")
        history.to_json(out / f"history_{slug}.json")
        skip = min(5, len(history) - 1)  # leave out the first steps (caches, Ray warming up)
        rows.append([label, f"{accuracies[label]:.2%}", f"{history.mean('loss', len(history) - 10):.4f}",
                     f"{history.mean('step_s', skip) * 1e3:.1f}", f"{history.mean('compute_s', skip) * 1e3:.1f}",
                     f"{history.mean('sync_s', skip) * 1e3:.1f}", f"{history.mean('hidden_fraction', skip):.0%}",
                     f"{history.mean('bytes_sent') / 2**20:.2f}", f"{history.mean('compression_ratio'):.1f}x"])
    print(f"\n{args.model} ({params:,} parameters), {args.workers} workers, {args.strategy}, batch {args.batch_size} "
          f"per worker, SGD lr {args.lr}, {args.steps} steps")
    print(format_table(["codec", "accuracy", "final loss", "ms/step", "compute ms", "sync ms", "sync hidden",
                        "MiB sent/step", "compression"], rows))
    plot(histories, accuracies, out / "loss_vs_step.png",
         f"digits, {args.model} ({params / 1e6:.1f}M params), {args.workers} workers, {args.strategy}")
    print(f"\nwrote {out / 'loss_vs_step.png'}, {out / 'timeline_onebit.png'} and history_*.json")
    if started:
        ray.shutdown()


if __name__ == "__main__":
    main()
