"""Sockets between actors: Unix-domain ones on one machine (under shared memory), TCP ones between machines.

Shared memory carries the payload bodies between actors on a machine (``casync.transport.shm``); what is left
is small messages (headers, the NaN/Inf side channel, bodies too big for their slot).  Over a socket per peer
and direction they need no process group, so actors on one machine never import torch nor open a TCP port,
and a peer that dies is seen at once as a closed connection.  Messages are framed ``(tag, nbytes, bytes)``;
a reader thread per incoming connection fills the receive posted for the tag (in order), or keeps the message
until one is posted.  Unix socket names live in Linux's abstract namespace: nothing on disk, gone with the
process.

The same channel over TCP (``host=``) carries everything between machines: each actor listens on its node's
address at a port the OS picks, and the peers learn the addresses before :meth:`SocketChannel.connect`.
A small message costs about half the CPU of a gloo ``isend``/``irecv`` pair, a large one the same
(``benchmarks/results/p2p_cpu``).
The connections are unauthenticated: keep the ports inside the cluster's network (docs/cluster.md).
"""
from __future__ import annotations

import socket
import struct
import threading
from collections import defaultdict, deque
from typing import Iterable, Mapping

import numpy as np

from ..errors import SyncError, SyncTimeoutError, WorkerLostError
from .base import DONE, Handle

_FRAME = struct.Struct("<qq")  # tag, body bytes
_ABORT_TAG = -(2 ** 63)  # a frame whose body is the reason its sender aborted (no transfer has this tag)
_ABORT_SEND_S = 1.0  # how long an abort waits to tell a peer before it just ends the stream
_HELLO = struct.Struct("<H")  # length of the connecting actor's name


class _Failed:
    """A receive that failed when it was posted (a message of the wrong size had come first): raises on wait."""

    def __init__(self, error: BaseException):
        self.error = error

    def wait(self) -> None:
        raise self.error


class _Receive:
    """A posted receive: ``wait()`` returns once the reader thread filled ``buf``, raises what failed it."""

    __slots__ = ("buf", "event", "error", "channel", "peer", "tag")

    def __init__(self, buf: np.ndarray, channel: "SocketChannel", peer: str, tag: int):
        self.buf, self.channel, self.peer, self.tag = buf, channel, peer, tag
        self.event = threading.Event()
        self.error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()

    def wait(self) -> None:
        if not self.event.wait(self.channel.timeout_s):
            raise SyncTimeoutError(f"{self.channel.actor}: nothing from {self.peer} (tag {self.tag}) within "
                                   f"{self.channel.timeout_s:g}s")
        if self.error is not None:
            raise self.error


class _Incoming:
    """One peer's messages to this actor: receives posted ahead per tag, and messages that came first."""

    def __init__(self) -> None:
        self.posted: dict[int, deque[_Receive]] = defaultdict(deque)
        self.early: dict[int, deque[np.ndarray]] = defaultdict(deque)
        self.error: BaseException | None = None


class SocketChannel:
    """An actor's end of the sockets to ``peers``.  Set up in two steps every actor takes together: construct
    (listen), then :meth:`connect` (connect to every peer, accept every peer).

    Without ``host``: Unix sockets named from ``prefix`` (peers on this machine).  With ``host``: TCP, listening
    on ``host`` at a port the OS picks (:attr:`address`); :meth:`connect` then needs every peer's address."""

    tells_peers_on_abort = True  # an abort frame to every peer (see abort)

    def __init__(self, actor: str, peers: Iterable[str], prefix: str, timeout_s: float = 60.0,
                 host: str | None = None):
        self.actor = actor
        self.peers = sorted(set(peers) - {actor})
        self.prefix = prefix
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._incoming = {p: _Incoming() for p in self.peers}
        self._out: dict[str, socket.socket] = {}
        self._send_locks = {p: threading.Lock() for p in self.peers}
        self._in: list[socket.socket] = []
        self._aborted: str | None = None
        self._tcp = host is not None
        if self._tcp:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._listener = socket.create_server((host, 0), family=family, backlog=len(self.peers) + 1)
        else:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(self._unix_address(actor))
            self._listener.listen(len(self.peers) + 1)

    @property
    def address(self) -> tuple[str, int] | None:
        """``(host, port)`` this actor listens on over TCP (None for Unix sockets)."""
        return tuple(self._listener.getsockname()[:2]) if self._tcp else None

    def _unix_address(self, actor: str) -> str:
        return f"\0{self.prefix}-{actor}"

    def _open(self, peer: str, addresses: Mapping[str, tuple[str, int]] | None) -> socket.socket:
        """A connected socket to ``peer`` (with no delay for small messages over TCP)."""
        if not self._tcp:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            sock.connect(self._unix_address(peer))
            return sock
        if not addresses or peer not in addresses:
            raise SyncError(f"{self.actor}: no TCP address for peer {peer!r}")
        sock = socket.create_connection(tuple(addresses[peer]), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def connect(self, addresses: Mapping[str, tuple[str, int]] | None = None) -> None:
        """Open one connection to each peer (they all listen already) and accept one from each; over TCP,
        ``addresses`` maps every peer to its :attr:`address`."""
        for peer in self.peers:
            name = self.actor.encode()
            sock = None
            try:
                sock = self._open(peer, addresses)  # its timeout bounds a send to a peer that stopped reading
                sock.sendall(_HELLO.pack(len(name)) + name)
            except OSError as exc:
                if sock is not None:
                    sock.close()
                where = f"at {addresses[peer]}" if self._tcp else "on this machine"
                raise WorkerLostError(f"{self.actor}: cannot connect to {peer} {where}: {exc}") from None
            self._out[peer] = sock
        self._listener.settimeout(self.timeout_s)
        for _ in self.peers:
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                raise SyncTimeoutError(f"{self.actor}: not every peer connected within "
                                       f"{self.timeout_s:g}s") from None
            sock.settimeout(self.timeout_s)
            if self._tcp:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            (size,) = _HELLO.unpack(_read(sock, _HELLO.size))
            peer = _read(sock, size).decode()
            if peer not in self._incoming:
                sock.close()
                raise SyncError(f"{self.actor}: a connection from {peer!r}, which is not one of its peers {self.peers}")
            sock.settimeout(None)  # a reader waits as long as the actor lives (steps may be far apart)
            self._in.append(sock)
            threading.Thread(target=self._read_loop, args=(sock, peer), daemon=True,
                             name=f"casync-socket-{self.actor}<-{peer}").start()
        self._listener.close()

    # -- the Channel protocol ---------------------------------------------------------------------------------
    def isend(self, buf: np.ndarray, peer: str, tag: int) -> Handle:
        self._check(peer)
        data = memoryview(np.ascontiguousarray(buf)).cast("B")
        try:
            with self._send_locks[peer]:
                sock = self._out[peer]
                sock.sendall(_FRAME.pack(tag, data.nbytes))
                sock.sendall(data)
        except socket.timeout:
            raise SyncTimeoutError(f"{self.actor}: {peer} took no message (tag {tag}) for "
                                   f"{self.timeout_s:g}s") from None
        except OSError as exc:
            raise WorkerLostError(f"{self.actor}: sending to {peer} failed: {exc}") from None
        return DONE

    def irecv(self, buf: np.ndarray, peer: str, tag: int) -> Handle:
        self._check(peer)
        incoming = self._incoming[peer]
        with self._lock:
            if incoming.early[tag]:
                data = incoming.early[tag].popleft()
            else:
                if incoming.error is not None:
                    raise incoming.error
                receive = _Receive(buf, self, peer, tag)
                incoming.posted[tag].append(receive)
                return receive
        try:
            _fill(buf, data, self.actor, peer, tag)
        except SyncError as exc:
            return _Failed(exc)
        return DONE

    def abort(self, reason: str) -> None:
        """Refuse further transfers, fail every receive still waiting, and tell every peer: an abort frame
        carrying ``reason``, then the end of the stream, so their receives from this actor fail at once rather
        than at their timeout."""
        with self._lock:
            first = self._aborted is None
            self._aborted = self._aborted or reason
            for incoming in self._incoming.values():
                self._fail(incoming, SyncError(f"{self.actor}: the data plane was aborted: {reason}"))
        if first:
            for peer, sock in list(self._out.items()):
                self._tell_aborted(peer, sock, reason)

    def _tell_aborted(self, peer: str, sock: socket.socket, reason: str) -> None:
        """Send ``peer`` the abort frame (unless a send to it holds its lock past :data:`_ABORT_SEND_S`: that
        message is then cut off, which the peer sees as a broken stream), then end the stream."""
        lock = self._send_locks[peer]
        if lock.acquire(timeout=_ABORT_SEND_S):
            try:
                body = reason.encode()[:4096]
                sock.settimeout(_ABORT_SEND_S)
                sock.sendall(_FRAME.pack(_ABORT_TAG, len(body)) + body)
            except OSError:
                pass  # the peer is gone or not reading: the end of the stream below is all it can get
            finally:
                lock.release()
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        for sock in [*self._out.values(), *self._in, self._listener]:
            try:  # wakes a reader thread blocked in recv on it (close alone leaves it there while the peer lives)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass

    # -- inside --------------------------------------------------------------------------------------------
    def _check(self, peer: str) -> None:
        if self._aborted:
            raise SyncError(f"{self.actor}: the data plane was aborted: {self._aborted}")
        if peer not in self._incoming:
            raise SyncError(f"{self.actor}: no socket to {peer!r} (its peers on this channel: {self.peers})")

    @staticmethod
    def _fail(incoming: _Incoming, error: BaseException) -> None:
        """(Under the lock.)  Fail ``incoming``'s posted receives and every later one."""
        if incoming.error is None:
            incoming.error = error
        for queue in incoming.posted.values():
            while queue:
                queue.popleft().fail(error)

    def _posted(self, incoming: _Incoming, tag: int) -> _Receive | None:
        """The oldest receive posted for ``tag``, taken off its queue (None: none is posted)."""
        with self._lock:
            queue = incoming.posted[tag]
            return queue.popleft() if queue else None

    def _read_loop(self, sock: socket.socket, peer: str) -> None:
        incoming = self._incoming[peer]
        receive: _Receive | None = None  # taken off its queue: the failure below must fail it too
        try:
            while True:
                receive = None
                tag, nbytes = _FRAME.unpack(_read(sock, _FRAME.size))
                if nbytes < 0:
                    raise _BadFrame(f"a frame of {nbytes} bytes (tag {tag})")
                if tag == _ABORT_TAG:
                    raise _PeerAborted(_read(sock, nbytes).decode(errors="replace"))
                receive = self._posted(incoming, tag)
                if receive is not None and receive.buf.nbytes == nbytes:  # straight into the posted buffer
                    _read_into(sock, memoryview(receive.buf).cast("B"))
                    receive.event.set()
                    continue
                data = np.empty(nbytes, np.uint8)
                _read_into(sock, memoryview(data))
                if receive is None:
                    with self._lock:
                        queue = incoming.posted[tag]  # one may have been posted while the body was read
                        if not queue:
                            incoming.early[tag].append(data)
                            continue
                        receive = queue.popleft()
                try:
                    _fill(receive.buf, data, self.actor, peer, tag)  # raises a size error naming the message
                except SyncError as exc:
                    receive.fail(exc)
                else:
                    receive.event.set()
        except Exception as exc:  # the stream is over: whatever ended it fails every receive from this peer
            if isinstance(exc, _PeerAborted):
                error: SyncError = SyncError(f"{self.actor}: {peer} aborted its data plane: {exc}")
            elif isinstance(exc, (OSError, EOFError)):
                reason = "closed its connection" if isinstance(exc, EOFError) else f"connection failed ({exc})"
                error = WorkerLostError(f"{self.actor}: {peer} {reason} (did its process die?)", lost=peer)
            else:  # a corrupt frame (say, a size no buffer can take): not a peer this actor can trust
                error = SyncError(f"{self.actor}: the stream from {peer} broke: {type(exc).__name__}: {exc}")
            with self._lock:
                self._fail(incoming, error)
                if receive is not None and not receive.event.is_set():  # its body was cut off mid-read
                    receive.fail(error)


class _BadFrame(Exception):
    """A frame header no sender of this module writes."""


class _PeerAborted(Exception):
    """The peer's abort frame arrived (its reason is the message)."""


def _read(sock: socket.socket, n: int) -> bytes:
    data = bytearray(n)
    _read_into(sock, memoryview(data))
    return bytes(data)


def _read_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < view.nbytes:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError
        got += k


def _fill(buf: np.ndarray, data: np.ndarray, actor: str, peer: str, tag: int) -> None:
    if buf.nbytes != data.nbytes:
        raise _size_error(actor, peer, tag, data.nbytes, buf.nbytes)
    memoryview(buf).cast("B")[:] = memoryview(data).cast("B")


def _size_error(actor: str, peer: str, tag: int, got: int, want: int) -> SyncError:
    return SyncError(f"{actor}: a message of {got} bytes from {peer} (tag {tag}) for a buffer of {want}")
