"""Keep freed buffers in the process heap so a step's arrays reuse the previous step's pages (glibc only).

Every op of a step allocates fresh partition-sized arrays (0.1-10 MB).  By default glibc serves those with
``mmap`` and unmaps them on free, and threads other than the main one get heaps of their own ("arenas",
64 MiB each) that are unmapped again when they empty.  Either way each array is page-faulted in again on
the next step, and NumPy asks for 2 MiB pages for large arrays, so the kernel zeroes them afresh: measured,
op time doubled in the Ray actors, and through the DDP hook (whose ops run on threads DDP and casync start)
a ResNet-50 ring/onebit sync took 0.6-1.4 s instead of 0.17 s, most of it in the kernel.  So: large blocks
come from the heap, up to 1 GiB of freed heap is kept, and every thread allocates from the main heap.
``CASYNC_KEEP_FREED_MEMORY=0`` leaves the allocator alone.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8

#: Syncs a host (Ray actor, DDP rank) runs before it stops allocating: the first faults in its result buffers
#: and residuals, the second a second set of residuals (``begin``'s ``spares``: the residuals a step reads are
#: never written), and from the third on each step writes where the one two back did.  The second sync of a
#: ResNet-50 ring/onebit actor faults ~10k pages and takes ~25 ms more CPU than the third: a benchmark times
#: steady state after this many untimed syncs.
WARMUP_SYNCS = 2


def keep_freed_memory() -> bool:
    """Apply the settings above to this process (idempotent); False where they cannot apply (not glibc,
    or ``CASYNC_KEEP_FREED_MEMORY=0``).  Best called early: threads that already have a heap of their own
    keep it."""
    if os.environ.get("CASYNC_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 256 << 20) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
                    and libc.mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False
