"""A torch.distributed process group as the data plane: gloo on CPU, NCCL where GPUs exist.

The actors of a plan form one group, set up as Ray Train sets up its workers: rank 0 listens on its address
(a port the OS picks, held from then on: no other process can take it before the group uses it), every actor
calls ``init_process_group`` with a TCP rendezvous there and a timeout of its own (a dead peer surfaces as an
error within it, never as a hang).  Buffers are NumPy arrays, handed to torch without copies.  The transport
is unauthenticated: keep its ports inside the cluster's network (see docs/cluster.md).
"""
from __future__ import annotations

import datetime
import os
import socket
from typing import Any, Mapping

import numpy as np

from ..errors import SyncError, SyncTimeoutError, WorkerLostError


def as_sync_error(exc: BaseException, what: str, peer: str | None = None) -> SyncError:
    """A failure of a gloo call as casync's typed error: a peer that left is a WorkerLostError (naming ``peer``,
    the actor at the other end, where the call had one), a timeout a SyncTimeoutError; anything else a SyncError
    naming what was being done.  (The executor wraps transport failures in a plain SyncError; those are
    classified by their message too.)"""
    if isinstance(exc, SyncError) and type(exc) is not SyncError:
        return exc
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = text.lower()
    if "timed out" in lowered or "timeout" in lowered:
        return SyncTimeoutError(f"{what}: {text}")
    if any(s in lowered for s in ("connection closed", "connection reset", "broken pipe", "connection refused",
                                  "socket closed", "by peer")):
        return WorkerLostError(f"{what}: {peer or 'a peer'} left the group ({text})", lost=peer)
    if isinstance(exc, SyncError):
        return exc
    return SyncError(f"{what}: {type(exc).__name__}: {text}")


def listen_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on ``host:port`` (0: a port the OS picks), for the group's rendezvous to take over
    (``init_group(listen_fd=)``): choosing a free port and binding it later races with every other process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


def host_store(timeout_s: float, host: str = "127.0.0.1") -> Any:
    """A rendezvous store served by this process (which is no rank) on a port the OS picks and it holds:
    processes it starts meet there with ``init_group(..., master=host, port=store.port)``."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, None, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def interface_of(address: str) -> str | None:
    """The network interface that holds IPv4 ``address`` on this machine (Linux), or None."""
    import fcntl
    import struct

    if address.startswith("127."):
        return "lo"
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
        if socket.inet_ntoa(raw[20:24]) == address:
            return name
    return None


def init_group(rank: int, world: int, master: str, port: int, *, backend: str = "gloo", timeout_s: float = 60.0,
               ifname: str | None = None, listen_fd: int | None = None) -> Any:
    """Join the process group of the plan's actors (this process's default group); returns torch.distributed.

    ``ifname``: the network interface gloo uses (``GLOO_SOCKET_IFNAME``), for machines where the default
    route is not the cluster's network.  ``listen_fd``: the rendezvous socket this rank already listens on
    (:func:`listen_socket`, detached; rank 0 of a Ray data plane), which its store server takes over; without
    one the rank joins a store served elsewhere (that rank's, or a parent's :func:`host_store`)."""
    import torch.distributed as dist

    if ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    if dist.is_initialized():
        dist.destroy_process_group()
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master, port, world, is_master=listen_fd is not None, timeout=timeout,
                          wait_for_workers=False, master_listen_fd=listen_fd)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return dist


class TorchChannel:
    """An actor's end of the process group; ``ranks`` maps actor names to group ranks."""

    #: a receive waits for its (peer, tag) alone: an aborting actor's executor tells the peers waiting for it
    tells_peers_on_abort = False

    def __init__(self, actor: str, ranks: Mapping[str, int], group: Any = None):
        import torch
        import torch.distributed as dist

        self.actor = actor
        self.ranks = dict(ranks)
        self.group = group
        self._dist, self._torch = dist, torch
        self._aborted: str | None = None

    def _peer(self, peer: str) -> int:
        rank = self.ranks[peer]
        if self.group is None:
            return rank
        return self._dist.get_global_rank(self.group, rank)

    def isend(self, buf: np.ndarray, peer: str, tag: int) -> Any:
        self._check()
        work = self._dist.isend(self._torch.from_numpy(buf), self._peer(peer), group=self.group, tag=tag)
        return _Transfer(work, f"{self.actor}: sending to {peer}", peer)

    def irecv(self, buf: np.ndarray, peer: str, tag: int) -> Any:
        self._check()
        work = self._dist.irecv(self._torch.from_numpy(buf), self._peer(peer), group=self.group, tag=tag)
        return _Transfer(work, f"{self.actor}: receiving from {peer}", peer)

    def _check(self) -> None:
        if self._aborted:
            raise SyncError(f"{self.actor}: the data plane was aborted: {self._aborted}")

    def abort(self, reason: str) -> None:
        """Refuse further transfers; transfers in flight end by the group's timeout or when the processes stop
        (a Ray engine's actors at its ``close()``)."""
        self._aborted = reason


class _Transfer:
    """A gloo transfer's handle whose failure is casync's typed error naming the peer (a rank that died is a
    WorkerLostError that says which, not gloo's bare "Connection closed by peer")."""

    __slots__ = ("work", "what", "peer")

    def __init__(self, work: Any, what: str, peer: str):
        self.work, self.what, self.peer = work, what, peer

    def wait(self) -> None:
        try:
            self.work.wait()
        except Exception as exc:
            raise as_sync_error(exc, self.what, self.peer) from exc
