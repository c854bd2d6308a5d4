"""A worker actor's results handed to a driver on its machine through shared memory, not Ray's object store.

A worker's results are 4 bytes per gradient float every step (102 MB for ResNet-50).  Returned through Ray
they are copied into the object store, and each step's copy lands on store pages the actor faults in afresh:
measured on 4 workers, 13-25 thousand page faults and about 85 ms of kernel time per actor per sync, on the
cores the other actors need for their ops.  Instead the actor writes its results into one segment it keeps
for its lifetime, the driver maps it once and copies each step's results out before the next step begins
(``RayEngine.run_flat`` is synchronous).  Actors on other machines, and a shared-memory filesystem without
room for the segment, use Ray's return as before.
"""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from ..transport.shm import SHM_DIR, attach, reserve_segment

__all__ = ["SHM_DIR", "MappedResults", "NoRoomError", "SharedResults", "room_for", "views"]


class NoRoomError(OSError):
    """The shared-memory filesystem has no room for a results segment (other segments took it meanwhile)."""


def room_for(nbytes: int, directory: str = SHM_DIR) -> bool:
    """Whether ``directory`` has room for ``nbytes`` more with a quarter to spare (a segment is sparse: writing
    past the free space would kill the writer with SIGBUS, never raise)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= nbytes * 1.25


def views(buf: memoryview, sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """One float32 array per bucket, laid out back to back in ``buf`` in the order of ``sizes``."""
    out, offset = {}, 0
    for bucket, n in sizes.items():
        out[bucket] = np.ndarray((n,), np.float32, buffer=buf, offset=offset)
        offset += 4 * n
    return out


class SharedResults:
    """The actor's end: creates the segment and gives the executor its result buffers."""

    def __init__(self, name: str, sizes: Mapping[str, int]):
        self.sizes = dict(sizes)
        shm = reserve_segment(name, max(4 * sum(self.sizes.values()), 1))  # its pages reserved: never a SIGBUS
        if shm is None:
            raise NoRoomError(f"no room in {SHM_DIR} for {4 * sum(self.sizes.values())} bytes of results")
        self.shm = shm
        self.buffers = views(self.shm.buf, self.sizes)

    @property
    def name(self) -> str:
        return self.shm.name

    def unlink(self) -> None:
        """Remove the name once the driver has mapped it: nothing is left behind if either process dies."""
        self.shm.unlink()


class MappedResults:
    """The driver's end: the actor's segment mapped read-only in spirit (copied out every step)."""

    def __init__(self, name: str, sizes: Mapping[str, int]):
        self.shm = attach(name)  # the actor owns the name; this process must not unlink it at exit
        self.buffers = views(self.shm.buf, sizes)

    def close(self) -> None:
        self.buffers = {}
        try:
            self.shm.close()
        except BufferError:  # a caller still holds a view; the mapping goes with the process
            pass
