"""Encode/decode throughput of every registered codec next to NumPy's copy.

    python benchmarks/codecs.py [--sizes 1000000 25000000] [--repeat 7] [--codecs topk onebit]

"EF (auto)" is the error feedback ``error_feedback="auto"`` gives the codec (``casync.primitives.feedback``: off,
plain, or on its contractive version).  Throughput is GB/s of float32 input (4n bytes / seconds), best of ``--repeat``
runs (the best run is the least disturbed one on a shared machine).  "x copy"
divides by the throughput of ``np.copyto`` into a preallocated array of the same
size, measured in the same run.  Data is standard-normal float32.  ``none``
encodes by aliasing its input, so its encode figure is call overhead only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from casync.sim.profiler import best_time  # noqa: E402

try:  # the engines' processes have torch loaded, and fp16 casts through it there (casync.primitives.codecs.dense.cast)
    import torch  # noqa: F401,E402
except ImportError:
    pass
from casync.primitives import feedback  # noqa: E402
from casync.primitives.codecs import available_codecs, get_codec, payload_nbytes  # noqa: E402
from casync.primitives.codecs.sparse import forget_random_indices  # noqa: E402

#: Parameters used for codecs that take some (others use their defaults).
BENCH_SPECS = {"topk": "topk:ratio=0.01", "randomk": "randomk:ratio=0.01"}


def copy_time(x: np.ndarray, repeat: int) -> float:
    dst = np.empty_like(x)
    return best_time(lambda: np.copyto(dst, x), max(repeat, 10))


def bench(names: list[str], sizes: list[int], repeat: int) -> list[dict]:
    rows = []
    for n in sizes:
        x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
        t_copy = copy_time(x, repeat)
        size_rows = []
        for name in names:
            codec = get_codec(BENCH_SPECS.get(name, name))
            seeds = iter(range(10**9))
            t_enc = best_time(lambda: codec.encode(x, seed=next(seeds)), repeat)
            payload = codec.encode(x, seed=1)
            # randomk keeps the indices of a seed it drew; each timed decode draws them afresh, as the encode does
            t_dec = best_time(lambda: codec.decode(payload, n), repeat, before=forget_random_indices)
            size_rows.append(
                {"codec": str(codec), "n": n, "ratio": 4 * n / payload_nbytes(payload),
                 "ef": feedback.kind(codec, feedback.resolve(codec, "auto")), "enc_s": t_enc, "dec_s": t_dec}
            )
        t_copy = min(t_copy, copy_time(x, repeat))  # copy again: keep the undisturbed figure
        for r in size_rows:
            r["copy_s"] = t_copy
        rows += size_rows
    return rows


def _num(v: float, width: int) -> str:
    """Two decimals, or three significant digits for the huge figures of zero-copy paths."""
    return f"{v:>{width}.2f}" if v < 10**4 else f"{v:>{width}.3g}"


def table(rows: list[dict]) -> str:
    head = (f"{'codec':<38}{'n':>11}{'ratio':>8}{'EF (auto)':>12}{'enc GB/s':>10}{'x copy':>9}{'dec GB/s':>10}"
            f"{'x copy':>9}")
    lines = [head, "-" * len(head)]
    last_n = None
    for r in rows:
        n = r["n"]
        gbs = lambda t: 4 * n / t / 1e9  # noqa: E731
        if n != last_n:
            lines.append(f"{'np.copyto':<38}{n:>11}{'':>8}{'':>12}{_num(gbs(r['copy_s']), 10)}{_num(1, 9)}")
            last_n = n
        enc, dec = r["enc_s"], r["dec_s"]
        lines.append(
            f"{r['codec']:<38}{n:>11}{r['ratio']:>8.1f}{r.get('ef', '?'):>12}"
            f"{_num(gbs(enc), 10)}{_num(r['copy_s'] / enc, 9)}{_num(gbs(dec), 10)}{_num(r['copy_s'] / dec, 9)}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 25_000_000])
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per measurement (best is kept)")
    ap.add_argument("--codecs", nargs="+", default=None, help="codec names (default: all registered)")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw timings here")
    args = ap.parse_args(argv)
    names = args.codecs or available_codecs()
    rows = bench(names, args.sizes, args.repeat)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
