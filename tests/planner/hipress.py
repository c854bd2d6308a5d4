"""A cost model built from HiPress's published SeCoPa fits (Bai et al., SOSP 2021), for planner tests.

HiPress fits each stage as ``f(x) = max(overhead, A + B x)`` in milliseconds for ``x`` float32 elements:

=====================  ============  =========  =========
stage                  B (ms/elem)   A (ms)     overhead
=====================  ============  =========  =========
encode                 1.4133e-8     5.8938e-2  0.05408
decode                 6.2041e-9     1.3956e-1  0.07287
merge                  free
ring send, per step    8.5005e-7     2.0337e-1  0.09766
PS gather, 4 nodes     2.7156e-6     0.41930    0.15573
PS broadcast, 4 nodes  2.7157e-6     0.22156    0.14820
=====================  ============  =========  =========

with a compression ratio of 1/16 (a 2-bit codec: ``tbq`` here).  Every intercept A exceeds its overhead, so
``max`` never bites and the fits are linear: ``a + b n`` in seconds.  A ring step moves one chunk over one
link, so the link is ``4 bytes / 8.5005e-10 s`` (37.6 Gbit/s) with 203 us of latency; a 4-node PS gather
moves 3 chunks into one host over that link, 3 x 8.5005e-7 = 2.55e-6 ms per element against the fitted
2.7156e-6 (the same link within 7%, which tests/planner/test_selective.py checks).
"""
from __future__ import annotations

from casync.sim.costmodel import ClusterModel, LinearCost, Profile

MS = 1e-3
ENCODE = (5.8938e-2, 1.4133e-8)
DECODE = (1.3956e-1, 6.2041e-9)
RING_STEP = (2.0337e-1, 8.5005e-7)
PS_GATHER_4 = (0.41930, 2.7156e-6)
PS_BROADCAST_4 = (0.22156, 2.7157e-6)
OVERHEADS = {"encode": 0.05408, "decode": 0.07287, "ring": 0.09766, "gather": 0.15573, "broadcast": 0.14820}
CODEC = "tbq"  # 2-bit: the fits' compression ratio of 1/16


def _linear(fit: tuple[float, float]) -> LinearCost:
    a, b = fit
    return LinearCost(a * MS, b * MS)


def profile() -> Profile:
    """Codec costs from the fits (no compression costs nothing), merge free, no per-task overhead."""
    codec = {"encode": _linear(ENCODE), "encode_ef": _linear(ENCODE), "decode": _linear(DECODE)}
    none = {"encode": LinearCost(0.0, 0.0), "decode": LinearCost(0.0, 0.0)}
    return Profile(codecs={"none": none, CODEC: codec}, merge=LinearCost(0.0, 0.0), transfer_alpha_s=0.0,
                   transfer_beta_bps=1e15, task_overhead_s=0.0, machine={"source": "HiPress SeCoPa fits"})


def link_bytes_per_s() -> float:
    return 4 / (RING_STEP[1] * MS)


def cluster(workers: int = 4) -> ClusterModel:
    """One worker per node on the fitted link: bandwidth from the ring step's slope, latency its intercept."""
    return ClusterModel.for_workers(workers, bandwidth_gbps=link_bytes_per_s() * 8 / 1e9,
                                    latency_us=RING_STEP[0] * MS * 1e6)
