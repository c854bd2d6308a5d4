"""Measure this machine's op costs (codecs, merge, actor-to-actor transfer) and fit them as ``a + b*n``.

Ops are timed as a sync runs them: inputs cold (the CPU caches flushed before every timed call: a step's
gradients, residuals and payloads were last touched long before, and a tensor of millions of floats never
fits anyway) and outputs written where the engines write them (a residual into the buffer of two steps back,
a decode into a result buffer), so no timed call pays for faulting in fresh pages.  Timed warm, as before,
the fit was set by the sizes that fit in cache and priced ops on large tensors 1.3-3x too cheap.
"""
from __future__ import annotations

import glob
import os
import platform
import time
from typing import Any, Callable, Iterable

import numpy as np

from casync.primitives.codecs import available_codecs, get_codec
from casync.primitives.codecs.sparse import forget_random_indices
from casync.primitives.merge import Deferred
from casync.primitives.ops import run_encode, run_merge

from .costmodel import LinearCost, Profile

DEFAULT_SIZES = tuple(2**k for k in range(10, 25, 2))  # 2^10 ... 2^24 elements
#: ``casync profile --quick``: half the sizes, spread over the whole range; the four smallest alone took well
#: under 0.1 ms per op after a cache flush, and a fit through them could find a slope of zero (merges free)
QUICK_SIZES = DEFAULT_SIZES[::2]
DEFAULT_CODECS = ("none", "fp16", "onebit", "terngrad", "tbq", "qsgd", "topk:ratio=0.01", "randomk:ratio=0.01")


def best_time(fn: Callable[[], object], repeat: int, before: Callable[[], object] | None = None) -> float:
    """Fastest of ``repeat`` timed calls (after one untimed warm-up call): the least noisy estimate here.
    ``before`` runs, untimed, ahead of each timed call (say, :meth:`CacheFlusher.flush`)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def largest_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache", default: int = 32 << 20) -> int:
    """Size of this CPU's largest cache, from Linux's ``<root>/index*/size`` (``default`` where none reads)."""
    sizes = []
    for path in glob.glob(os.path.join(root, "index*", "size")):
        try:
            with open(path) as f:
                text = f.read().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text[:-1] if unit > 1 else text) * unit)
        except (OSError, ValueError):
            continue
    return max(sizes, default=default)


#: The most a cache flush writes (a sysfs size is per cache instance; this bounds a misread one)
MAX_FLUSH_BYTES = 512 << 20


class CacheFlusher:
    """Writes a buffer twice the size of the largest cache (at most :data:`MAX_FLUSH_BYTES`), so what an op
    reads next comes from memory."""

    def __init__(self, nbytes: int | None = None):
        self.buffer = np.zeros(nbytes or min(2 * largest_cache_bytes(), MAX_FLUSH_BYTES), np.uint8)
        self._value = 0

    def flush(self) -> None:
        self._value = (self._value + 1) % 251
        self.buffer.fill(self._value)


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
    DDP ranks, the Trainer) have it loaded, and fp16 casts through it there (``casync.primitives.codecs.dense.cast``),
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
    flush = CacheFlusher().flush

    def cold() -> None:  # caches cold, and randomk's indices drawn afresh in every timed call
        flush()
        forget_random_indices()

    out: dict[str, dict[str, LinearCost]] = {}
    for spec in tqdm(list(codecs), desc="codecs", disable=not progress):
        codec = get_codec(spec)
        times: dict[str, list[float]] = {"encode": [], "encode_ef": [], "decode": []}
        for n in sizes:
            x = data[n]
            reps = repeat if n <= 2**20 else max(1, repeat - 1)
            payload = codec.encode(x, 1)
            times["encode"].append(best_time(lambda: codec.encode(x, 1), reps, cold))
            feedback = _Feedback(n)
            times["encode_ef"].append(best_time(lambda: feedback.encode(codec, x), reps, cold))
            result = np.empty(n, np.float32)
            times["decode"].append(best_time(lambda: codec.decode_into(payload, n, result), reps, cold))
            if codec.decodes_sparse:  # a decode handed to its merge: the entries, added into a sum
                acc = np.zeros(n, np.float32)
                times.setdefault("entries", []).append(
                    best_time(lambda: np.add.at(acc, *codec.sparse_entries(payload, n)), reps, cold))
            if codec.decodes_in_blocks:  # decodes handed to their merge: what one more payload adds to it
                times.setdefault("deferred", []).append(_deferred_time(codec, x, result, reps, cold))
            if shares_payload(codec):  # a decode that is no output: the payload's own array (the identity's)
                times.setdefault("shared", []).append(best_time(lambda: codec.decode_shared(payload, n), reps, cold))
        out[str(codec)] = {op: fit_linear(sizes, t) for op, t in times.items()}
    return out


def shares_payload(codec: Any) -> bool:
    """Whether ``codec`` decodes into something other than an output by handing out its payload's own array
    (``Codec.decode_shared`` overridden, as the identity does): the executor's decodes that are no output cost
    that, not a decode (``casync.primitives.ops.run_node``), and the profile prices them as ``shared``."""
    from casync.primitives.codecs.base import Codec

    return type(codec).decode_shared is not Codec.decode_shared


def _deferred_time(codec: Any, x: np.ndarray, out: np.ndarray, reps: int, before: Callable[[], object]) -> float:
    """Seconds one more :class:`~casync.primitives.merge.Deferred` payload adds to a merge (as an all-gather's or a
    server's runs, through the codec's one-pass merge where it has one): half the difference between merging
    four distinct payloads and two, the accumulator's own pass cancelling out (never below zero)."""
    payloads = [Deferred(codec, codec.encode(x * np.float32(k + 1), 1), x.size) for k in range(4)]
    two = best_time(lambda: run_merge(payloads[:2], 4, out=out), reps, before)
    four = best_time(lambda: run_merge(payloads, 4, out=out), reps, before)
    return max(0.0, (four - two) / 2)


class _Feedback:
    """Error-feedback encodes as a host runs them step after step: the new residual goes into the buffer of
    two steps back (``run_encode``'s ``spares``)."""

    def __init__(self, n: int):
        self.residuals = {"k": np.zeros(n, np.float32)}
        self.spares = {"k": np.zeros(n, np.float32)}

    def encode(self, codec: Any, x: np.ndarray) -> None:
        replaced = self.residuals["k"]
        run_encode(codec, x, 1, self.residuals, "k", spares=self.spares)
        self.spares = {"k": replaced}


def profile_merge(sizes: Iterable[int] = DEFAULT_SIZES, repeat: int = 3) -> LinearCost:
    """Cost per input element of summing float32 arrays (one ``np.add`` pass per input)."""
    sizes = list(sizes)
    rng = np.random.default_rng(1)
    cold = CacheFlusher().flush
    secs = []
    for n in sizes:
        xs = [rng.standard_normal(n, dtype=np.float32) for _ in range(2)]
        result = np.empty(n, np.float32)
        secs.append(best_time(lambda: run_merge(xs, 2, out=result), repeat if n <= 2**20 else max(1, repeat - 1),
                              cold) / 2)
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
