"""Measure this machine's op costs (codecs, merge, actor-to-actor transfer) and fit them as ``a + b*n``."""
from __future__ import annotations

import os
import platform
import time
from typing import Callable, Iterable

import numpy as np

from primitives.codecs import available_codecs, get_codec
from primitives.ops import run_encode

from .costmodel import LinearCost, Profile

DEFAULT_SIZES = tuple(2**k for k in range(10, 25, 2))  # 2^10 ... 2^24 elements
DEFAULT_CODECS = ("none", "fp16", "onebit", "terngrad", "tbq", "qsgd", "topk:ratio=0.01", "randomk:ratio=0.01")


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` timed calls (after one untimed warm-up call): the least noisy estimate here."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def fit_linear(sizes: Iterable[float], seconds: Iterable[float]) -> LinearCost:
    """Least squares on relative error (small and large sizes weigh alike), clipped to non-negative terms."""
    x, y = np.asarray(list(sizes), float), np.asarray(list(seconds), float)
    w = 1.0 / np.maximum(y, 1e-9)
    a_mat = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(a_mat, y * w, rcond=None)
    if a < 0:
        a, b = 0.0, float(np.sum(x * y * w * w) / np.sum(x * x * w * w))
    if b < 0:
        a, b = float(np.min(y)), 0.0
    return LinearCost(float(a), float(b))


def profile_codecs(codecs: Iterable[str] = DEFAULT_CODECS, sizes: Iterable[int] = DEFAULT_SIZES,
                   repeat: int = 3, progress: bool = False) -> dict[str, dict[str, LinearCost]]:
    """encode, encode with error feedback, and decode cost of each codec, fitted over ``sizes``.

    PyTorch is imported first where it is installed, on one thread: every engine's processes (Ray actors,
    DDP ranks, the Trainer) have it loaded, and fp16 casts through it there (``primitives.codecs.dense.cast``),
    one op on one core."""
    try:
        import torch
    except ImportError:
        return _profile_codecs(codecs, sizes, repeat, progress)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _profile_codecs(codecs, sizes, repeat, progress)
    finally:
        torch.set_num_threads(threads)


def _profile_codecs(codecs: Iterable[str], sizes: Iterable[int], repeat: int,
                    progress: bool) -> dict[str, dict[str, LinearCost]]:
    from tqdm.auto import tqdm

    rng = np.random.default_rng(0)
    sizes = list(sizes)
    data = {n: rng.standard_normal(n, dtype=np.float32) for n in sizes}
    out: dict[str, dict[str, LinearCost]] = {}
    for spec in tqdm(list(codecs), desc="codecs", disable=not progress):
        codec = get_codec(spec)
        times: dict[str, list[float]] = {"encode": [], "encode_ef": [], "decode": []}
        for n in sizes:
            x = data[n]
            reps = repeat if n <= 2**20 else 1
            payload = codec.encode(x, 1)
            times["encode"].append(best_time(lambda: codec.encode(x, 1), reps))
            residuals = {"k": np.zeros(n, np.float32)}
            times["encode_ef"].append(best_time(lambda: run_encode(codec, x, 1, residuals, "k"), reps))
            times["decode"].append(best_time(lambda: codec.decode(payload, n), reps))
            if codec.decodes_sparse:  # a decode handed to its merge: the entries, added into a sum
                acc = np.zeros(n, np.float32)
                times.setdefault("entries", []).append(
                    best_time(lambda: np.add.at(acc, *codec.sparse_entries(payload, n)), reps))
        out[str(codec)] = {op: fit_linear(sizes, t) for op, t in times.items()}
    return out


def profile_merge(sizes: Iterable[int] = DEFAULT_SIZES, repeat: int = 3) -> LinearCost:
    """Cost per input element of summing float32 arrays (one ``np.add`` pass per input)."""
    from primitives.ops import run_merge

    sizes = list(sizes)
    rng = np.random.default_rng(1)
    secs = []
    for n in sizes:
        xs = [rng.standard_normal(n, dtype=np.float32) for _ in range(2)]
        secs.append(best_time(lambda: run_merge(xs, 2), repeat if n <= 2**20 else 1) / 2)
    return fit_linear(sizes, secs)


def profile(codecs: Iterable[str] = DEFAULT_CODECS, sizes: Iterable[int] = DEFAULT_SIZES, repeat: int = 3,
            transfer: tuple[float, float, float] | None = None, progress: bool = True) -> Profile:
    """Measure every op cost the simulator needs on this machine.  ``transfer``: ``(alpha_s, beta_bytes_per_s,
    task_overhead_s)`` of the data plane, measured by ``casync.runtime.transfer.profile_transfer`` (it needs
    processes); None keeps the packaged profile's."""
    codec_costs = profile_codecs(codecs, sizes, repeat, progress)
    merge = profile_merge(sizes, repeat)
    if transfer is not None:
        alpha, beta, overhead = transfer
    else:
        base = Profile.default()
        alpha, beta, overhead = base.transfer_alpha_s, base.transfer_beta_bps, base.task_overhead_s
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "numpy": np.__version__, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    return Profile(codecs=codec_costs, merge=merge, transfer_alpha_s=alpha, transfer_beta_bps=beta,
                   task_overhead_s=overhead, machine=machine)


__all__ = ["DEFAULT_CODECS", "DEFAULT_SIZES", "available_codecs", "fit_linear", "profile"]
