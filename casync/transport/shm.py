"""Shared memory between actors on one machine: a payload body is copied once, straight into its receiver.

Every actor owns a receive arena (POSIX shared memory) with a fixed slot for each payload it receives from
an actor on its own node, in two copies (even and odd steps: a peer may already write step t+1 while this
actor still reads step t).  A sender writes the body into the receiver's slot, then sends the small header
over the base channel (gloo), which tells the receiver the body is there; the receiver reads it in place.
Transfers between nodes, headers and the NaN/Inf side channel go over the base channel unchanged.  Slot
sizes are exact because codecs report exact wire sizes.
"""
from __future__ import annotations

import errno
import mmap
import os
import sys
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any, Iterable, Mapping

import numpy as np

ALIGN = 64
#: where Linux keeps POSIX shared memory objects
SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class Transfer:
    """One send -> recv pair of a plan: its id, ends and exact body size."""

    id: int
    src: str
    dst: str
    nbytes: int


@dataclass(frozen=True)
class Arena:
    """One receiver's arena: ``(offset, size)`` of each same-node transfer's slot in one half (``half`` bytes;
    the other half holds the other parity of steps), and the actors that write into it."""

    half: int
    slots: Mapping[int, tuple[int, int]]
    senders: frozenset[str]


def arenas(transfers: Iterable[Transfer], node_of: Mapping[str, Any]) -> dict[str, Arena]:
    """The arena of every actor that receives from an actor on its own node (transfers between nodes have none)."""
    slots: dict[str, dict[int, tuple[int, int]]] = {}
    ends: dict[str, int] = {}
    senders: dict[str, set[str]] = {}
    for t in sorted(transfers, key=lambda t: t.id):
        if node_of[t.src] != node_of[t.dst]:
            continue
        end = ends.get(t.dst, 0)
        slots.setdefault(t.dst, {})[t.id] = (end, t.nbytes)
        ends[t.dst] = end + -(-max(t.nbytes, 1) // ALIGN) * ALIGN
        senders.setdefault(t.dst, set()).add(t.src)
    return {dst: Arena(ends[dst], slots[dst], frozenset(senders[dst])) for dst in slots}


def reserve_segment(name: str, size: int) -> shared_memory.SharedMemory | None:
    """A new segment ``name`` of ``size`` bytes with its pages reserved, or None where the shared-memory
    filesystem has no room for them.  A segment is sparse: without the reservation, writing past the free space
    (Docker gives /dev/shm 64 MB) kills the writer with SIGBUS instead of raising."""
    shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    if not hasattr(os, "posix_fallocate"):  # not on this platform: the segment stays sparse
        return shm
    try:
        os.posix_fallocate(shm._fd, 0, size)  # type: ignore[attr-defined]
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # this filesystem cannot reserve: it stays sparse
            return shm
        shm.close()
        shm.unlink()
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            return None
        raise
    return shm


def arena_name(prefix: str, actor: str) -> str:
    """The shared-memory name of ``actor``'s arena among the arenas named from ``prefix``."""
    return f"{prefix}-{actor.replace(':', '')}"


class _Mapped:
    """A segment another process made, mapped read-write, unknown to Python's resource tracker: its owner alone
    unlinks it."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR)
        try:
            self._mmap = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        self.buf.release()
        self._mmap.close()


def attach(name: str) -> Any:
    """Map the shared memory ``name`` that another process created, without registering it with this process's
    resource tracker.  Registering and then unregistering it (the usual workaround) is wrong where processes
    share one tracker (ranks started by ``torch.multiprocessing.spawn``): the unregister removes the owner's
    registration, and the tracker prints a ``KeyError`` traceback when the owner unlinks the arena."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    path = os.path.join(SHM_DIR, name.lstrip("/"))
    if os.path.exists(path):  # Linux keeps POSIX shared memory there
        return _Mapped(path)
    shm = shared_memory.SharedMemory(name=name)  # elsewhere: the workaround (a private tracker per process)
    try:
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:
        pass
    return shm


class ShmChannel:
    """An actor's end of the data plane when some peers share its machine: bodies to and from them through
    shared memory, everything else through ``base``."""

    def __init__(self, base: Any, actor: str, layout: Mapping[str, Arena], prefix: str):
        self.base = base
        self.actor = actor
        self.layout = layout
        self.prefix = prefix
        self._own: shared_memory.SharedMemory | None = None
        self._peers: dict[str, Any] = {}
        #: why this actor has no arena although the layout gives it one (its bodies then come over ``base``)
        self.no_arena: str | None = None
        if actor in layout:
            self._own = reserve_segment(self._name(actor), 2 * layout[actor].half)
            if self._own is None:
                self.no_arena = (f"no room in {SHM_DIR} for a receive arena of {2 * layout[actor].half} bytes: "
                                 "payload bodies go over sockets")

    def _name(self, actor: str) -> str:
        return arena_name(self.prefix, actor)

    def attach(self) -> None:
        """Map the arenas of the same-node actors this one sends to (after every owner created its own); the
        arenas of other nodes' actors are in their machines' shared memory, not this one's."""
        for receiver, arena in self.layout.items():
            if receiver != self.actor and self.actor in arena.senders:
                try:
                    self._peers[receiver] = attach(self._name(receiver))
                except FileNotFoundError:  # it found no room for its arena: its bodies go over the base channel
                    pass

    def unlink(self) -> None:
        """Remove this actor's arena name (every peer has mapped it): nothing is left behind if a process dies."""
        if self._own is not None:
            try:
                self._own.unlink()
            except FileNotFoundError:  # already removed (a driver cleaning up after a failed formation)
                pass

    def _slot(self, shm: Any, receiver: str, transfer: int, nbytes: int, step: int
              ) -> np.ndarray | None:
        """The slot of ``transfer`` in ``receiver``'s arena for ``step``; None when the body does not fit it
        (a codec's payload grew, e.g. a sparsity warm-up): both ends then use the base channel."""
        arena = self.layout.get(receiver)
        slot = None if arena is None else arena.slots.get(transfer)
        if slot is None or nbytes > slot[1]:
            return None
        offset = slot[0] + (step % 2) * arena.half
        return np.ndarray((nbytes,), np.uint8, buffer=shm.buf, offset=offset)

    # -- the executor's body path ----------------------------------------------------------------------------
    def body_buffer(self, peer: str, transfer: int, nbytes: int, step: int) -> np.ndarray | None:
        """Where ``peer`` writes this transfer's body directly (None: receive it through the base channel)."""
        if self._own is None:
            return None
        return self._slot(self._own, self.actor, transfer, nbytes, step)

    def put_body(self, body: np.ndarray, peer: str, transfer: int, step: int) -> bool:
        """Copy the body into ``peer``'s slot; False when ``peer`` is not on this machine."""
        shm = self._peers.get(peer)
        slot = None if shm is None else self._slot(shm, peer, transfer, body.nbytes, step)
        if slot is None:
            return False
        slot[...] = body
        return True

    # -- everything else goes through the base channel ------------------------------------------------------
    def isend(self, buf: np.ndarray, peer: str, tag: int) -> Any:
        return self.base.isend(buf, peer, tag)

    def irecv(self, buf: np.ndarray, peer: str, tag: int) -> Any:
        return self.base.irecv(buf, peer, tag)

    def abort(self, reason: str) -> None:
        self.base.abort(reason)

    @property
    def tells_peers_on_abort(self) -> bool:
        return bool(getattr(self.base, "tells_peers_on_abort", False))

    def close(self) -> None:
        for shm in self._peers.values():
            shm.close()
        if self._own is not None:
            self._own.close()
