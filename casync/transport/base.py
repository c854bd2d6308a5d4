"""What an executor needs from a transport: non-blocking point-to-point sends and receives of byte buffers.

A :class:`Channel` connects the actors of one plan (workers and dedicated servers).  ``isend``/``irecv``
return a handle whose ``wait()`` blocks until the buffer may be reused (send) or is filled (receive);
messages between two actors with the same tag arrive in the order they were sent.  Implementations:
:class:`LocalHub` (threads of one process; tests and debugging), ``casync.transport.sockets`` (Unix sockets
between the processes of one machine) and ``casync.transport.torchdist`` (a ``torch.distributed`` process
group: gloo on CPU, NCCL on GPU); :class:`RoutedChannel` combines the second and third.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import Iterable, Protocol

import numpy as np

from ..errors import SyncError, SyncTimeoutError, WorkerLostError


class Handle(Protocol):
    def wait(self) -> None: ...


class Channel(Protocol):
    """One actor's end of a transport.  A channel whose :meth:`abort` itself makes the peers' waiting receives
    fail says so with a ``tells_peers_on_abort = True`` attribute; for one without (False when absent), the
    executor first sends each peer still waiting for it an abort notice (casync.engines.executor)."""

    actor: str

    def isend(self, buf: np.ndarray, peer: str, tag: int) -> Handle: ...

    def irecv(self, buf: np.ndarray, peer: str, tag: int) -> Handle: ...

    def abort(self, reason: str) -> None: ...


class _Done:
    def wait(self) -> None:
        return None


#: the handle of a transfer already complete (a send that has written its buffer, a receive filled at once)
DONE: Handle = _Done()


class LocalHub:
    """In-process mailboxes between actors running in threads of one process (copies every message).

    ``timeout_s`` bounds every receive; :meth:`abort` (say, from a failing peer) makes every pending and
    later receive raise at once, so no thread waits on a peer that is gone.
    """

    def __init__(self, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self._boxes: dict[tuple[str, str, int], deque] = defaultdict(deque)
        self._cond = threading.Condition()
        self._aborted: str | None = None

    def channel(self, actor: str) -> "LocalChannel":
        return LocalChannel(self, actor)

    def abort(self, reason: str) -> None:
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()


class LocalChannel:
    """An actor's end of a :class:`LocalHub`."""

    tells_peers_on_abort = True  # an abort fails every receive on the hub

    def __init__(self, hub: LocalHub, actor: str):
        self.hub = hub
        self.actor = actor

    def isend(self, buf: np.ndarray, peer: str, tag: int) -> Handle:
        with self.hub._cond:
            self.hub._boxes[(self.actor, peer, tag)].append(np.array(buf, copy=True))
            self.hub._cond.notify_all()
        return DONE

    def irecv(self, buf: np.ndarray, peer: str, tag: int) -> Handle:
        hub, key = self.hub, (peer, self.actor, tag)

        class _Recv:
            def wait(self_) -> None:
                deadline = time.monotonic() + hub.timeout_s
                with hub._cond:
                    while not hub._boxes[key]:
                        if hub._aborted:
                            raise WorkerLostError(f"{self.actor}: receive from {peer} aborted: {hub._aborted}")
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise SyncTimeoutError(f"{self.actor}: nothing from {peer} (tag {tag}) within "
                                                   f"{hub.timeout_s:.0f}s")
                        hub._cond.wait(left)
                    data = hub._boxes[key].popleft()
                if data.shape != buf.shape:
                    raise ValueError(f"{self.actor}: a message of {data.nbytes} bytes from {peer} (tag {tag}) for a "
                                     f"buffer of {buf.nbytes}")
                buf[...] = data

        return _Recv()

    def abort(self, reason: str) -> None:
        self.hub.abort(reason)


class RoutedChannel:
    """Two channels as one: messages to and from ``near_peers`` through ``near`` (sockets on this machine),
    every other peer's through ``far`` (the process group between machines)."""

    def __init__(self, actor: str, near: Channel, near_peers: Iterable[str], far: Channel | None):
        self.actor = actor
        self.near, self.far = near, far
        self.near_peers = frozenset(near_peers)

    def _route(self, peer: str) -> Channel:
        if peer in self.near_peers:
            return self.near
        if self.far is None:
            raise SyncError(f"{self.actor}: {peer} is not on this machine and no channel between machines was formed")
        return self.far

    def isend(self, buf: np.ndarray, peer: str, tag: int) -> Handle:
        return self._route(peer).isend(buf, peer, tag)

    def irecv(self, buf: np.ndarray, peer: str, tag: int) -> Handle:
        return self._route(peer).irecv(buf, peer, tag)

    def abort(self, reason: str) -> None:
        for channel in (self.near, self.far):
            if channel is not None:
                channel.abort(reason)

    @property
    def tells_peers_on_abort(self) -> bool:
        return all(getattr(c, "tells_peers_on_abort", False) for c in (self.near, self.far) if c is not None)

    def close(self) -> None:
        for channel in (self.near, self.far):
            if channel is not None and hasattr(channel, "close"):
                channel.close()
