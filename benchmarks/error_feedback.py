"""Does the time-averaged synced gradient converge to the true mean?  Every codec x strategy, with and without
error feedback.

    python benchmarks/error_feedback.py [--workers 4] [--steps 400] [--out benchmarks/results/error_feedback]

The same gradients (a shared signal plus per-worker noise, below tbq's threshold) are synced ``--steps``
times on ``LocalEngine``; the table gives ``||mean_t(result_t) - mean_w(grad_w)|| / ||mean_w(grad_w)||`` for

* **off** — ``error_feedback=False``;
* **plain** — plain error feedback forced on (the codec's ``ef_sound`` set to True): what casync did for
  every codec before error feedback became ``"auto"``;
* **auto** — the default: plain error feedback for contractive codecs, error feedback on the contractive
  version (output scaled by ``1 / (1 + omega)``) for unbiased stochastic codecs (``casync.primitives.feedback``).

Writes ``error_feedback.md`` and ``error_feedback.json``.
"""
from __future__ import annotations

import argparse
import platform
import time

import numpy as np

import casync
from casync.table import format_table, markdown_table
from casync.primitives.codecs import available_codecs, get_codec
from result_files import write_results

SHAPES = {"w": (4096,), "b": (300,)}
VARIANTS = {"ring": dict(strategy="ring"), "ps": dict(strategy="ps"), "ps-oneway": dict(strategy="ps", two_way=False),
            "allgather": dict(strategy="allgather")}


def gradients(workers: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """A shared signal in [-0.1, 0.1] plus per-worker noise: every partial sum of 4 workers stays below tbq's
    default threshold of 0.5 (tbq never sends more than its threshold per step)."""
    rng = np.random.default_rng(seed)
    signal = {k: rng.uniform(-0.1, 0.1, s).astype(np.float32) for k, s in SHAPES.items()}
    return [{k: (v + rng.normal(0, 0.01, v.shape)).astype(np.float32) for k, v in signal.items()}
            for _ in range(workers)]


def forced_plain(codec):
    """The same codec, declared sound for plain error feedback (the old behaviour for every codec)."""
    cls = type(codec)
    plain = type(f"Plain{cls.__name__}", (cls,), {"ef_sound": True})
    return plain(**codec.params())


def relative_error(plan: casync.SyncPlan, grads: list[dict[str, np.ndarray]], steps: int) -> float:
    """Relative error of the time-averaged result of worker 0 against the true mean."""
    engine = casync.LocalEngine(plan)
    total = {k: np.zeros(s, np.float64) for k, s in SHAPES.items()}
    for _ in range(steps):
        out = engine.sync(grads)[0]
        for k in total:
            total[k] += out[k]
    truth = np.concatenate([np.mean([g[k] for g in grads], axis=0, dtype=np.float64) for k in SHAPES])
    got = np.concatenate([total[k] / steps for k in SHAPES])
    return float(np.linalg.norm(got - truth) / np.linalg.norm(truth))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", default="benchmarks/results/error_feedback")
    args = parser.parse_args()
    grads = gradients(args.workers)
    rows, raw = [], []
    started = time.perf_counter()
    for name in available_codecs():
        codec = get_codec(name)
        if codec.lossless or codec.votes:  # a vote (signsgd) is no estimate of the mean and has no residual
            continue
        for label, kw in VARIANTS.items():
            errs = {}
            for mode, (c, ef) in {"off": (codec, False), "plain": (forced_plain(codec), True),
                                  "auto": (codec, "auto")}.items():
                plan = casync.build_plan(SHAPES, workers=args.workers, codec=c, error_feedback=ef, bucket_bytes=0,
                                         **kw)
                errs[mode] = relative_error(plan, grads, args.steps)
            kind = "plain" if codec.ef_sound else "contractive"
            rows.append([name, label, f"{errs['off']:.3g}", f"{errs['plain']:.3g}", f"{errs['auto']:.3g}", kind])
            raw.append(dict(codec=name, strategy=label, **errs, auto_kind=kind))
            print(format_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
    elapsed = time.perf_counter() - started
    text = ("# Error feedback: does the time average converge?\n\n"
            f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by\n\n```\npython benchmarks/error_feedback.py "
            f"--workers {args.workers} --steps {args.steps}\n```\n\n({elapsed:.0f} s, Python {platform.python_version()}.)\n\n"
            f"Relative error of the time-averaged result of {args.steps} syncs of the same gradients ({args.workers} "
            "workers, tensors of 4096 and 300 elements, one bucket each) against their true mean. *off*: no error "
            "feedback; *plain*: plain error feedback forced on (what casync did before for every codec); *auto*: the "
            "default (*auto EF*: plain for contractive codecs, on the contractive version for unbiased ones).\n\n"
            + markdown_table(HEADERS, rows) + "\n")
    md = write_results(args.out, "error_feedback", text, raw)
    print(f"wrote {md} ({elapsed:.0f} s)")


HEADERS = ["codec", "strategy", "off", "plain", "auto", "auto EF"]

if __name__ == "__main__":
    main()
