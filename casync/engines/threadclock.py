"""How long the calling thread has waited, runnable, for a CPU: Linux's per-thread schedstat.

An op's wall time is its own CPU, plus waiting for a core (runnable, another thread on it), plus waiting while
blocked: in an op that is the GIL, since ops take no other lock.  ``time.thread_time`` gives the first; this gives
the second, so the executor's records can tell a rank short of cores from one short of the GIL.  The counter is
the kernel's ``run_delay``, brought up to date each time the thread is scheduled in, so a running thread reads it
exactly.  Each thread keeps its own descriptor of ``/proc/thread-self/schedstat``, closed when the thread ends,
and reads it holding the GIL (libc's ``pread`` through ``ctypes.PyDLL``, about 2 µs): ``os.pread`` would let the
GIL go and take it back twice per op, and with a rank's other threads waiting for it each take can cost far
more than the read.
"""
from __future__ import annotations

import ctypes
import os
import threading

_SCHEDSTAT = "/proc/thread-self/schedstat"


def _gil_holding_pread():
    """libc's ``pread``, called without releasing the GIL; None where there is none to call."""
    try:
        pread = ctypes.PyDLL(None).pread
    except (OSError, AttributeError, TypeError):  # no C library to load by name (not a POSIX system)
        return None
    pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    pread.restype = ctypes.c_ssize_t
    return pread


_pread = _gil_holding_pread()


class _Reader:
    """One thread's open schedstat file and read buffer; the file is closed when the thread's locals go (the
    thread ended)."""

    __slots__ = ("fd", "buf")

    def __init__(self) -> None:
        self.buf = ctypes.create_string_buffer(64)
        try:
            self.fd: int | None = (os.open(_SCHEDSTAT, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                                   if _pread is not None else None)
        except OSError:  # not Linux, or a kernel without schedstat
            self.fd = None

    def __del__(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_local = threading.local()


def run_queue_wait() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a CPU since it started, or None where the
    system does not say (not Linux)."""
    reader = getattr(_local, "reader", None)
    if reader is None:
        reader = _local.reader = _Reader()
    if reader.fd is None:
        return None
    n = _pread(reader.fd, reader.buf, 64, 0)
    if n <= 0:  # the read failed
        return None
    try:
        return int(reader.buf.raw[:n].split()[1]) / 1e9
    except (ValueError, IndexError):
        return None
