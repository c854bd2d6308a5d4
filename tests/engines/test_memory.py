"""keep_freed_memory: a step's arrays reuse the previous step's pages, on every thread (glibc only)."""
from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from casync.engines.memory import keep_freed_memory

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")

#: a worker thread started per "step" allocates and frees 20 arrays of 6.5 MB (like an executor's ops)
PROBE = r"""
import resource, sys, threading
import numpy as np
from casync.engines.memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "on" else False
faults = []
def step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.full(1_600_000, 1.0, np.float32) for _ in range(20)]
    del arrays
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
for _ in range(4):
    t = threading.Thread(target=step)
    t.start()
    t.join()
print(applied, *faults)
"""


def run_probe(mode: str) -> tuple[bool, list[int]]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    applied, *faults = out.stdout.split()
    return applied == "True", [int(f) for f in faults]


@glibc
def test_later_steps_on_new_threads_reuse_the_pages():
    applied, faults = run_probe("on")
    assert applied
    first, later = faults[0], faults[1:]
    # 130 MB touched for the first time: about 33k faults of 4 KiB pages, fewer where the kernel maps larger
    # folios (about 10k on a 6.18 kernel), never fewer than one per 2 MiB page (62)
    assert first > 1_000, faults
    assert max(later) < first / 10, faults  # the freed heap is kept and shared by the next threads


def test_opt_out_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setenv("CASYNC_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory() is False
