"""The direct data plane on Ray, both sides: what every actor does to join it, and how a driver forms it.

The actors of an engine (RayEngine's or a Trainer's) form one torch.distributed process group, set up as Ray
Train sets up its workers: the first actor picks its node's address and a port, all of them call
``init_process_group`` at once.  With ``transport="direct"`` actors on one node map each other's shared-memory
receive arenas (``casync.transport.shm``; every name is unlinked once mapped) and send each other the rest
over Unix sockets (``casync.transport.sockets``); the process group is then formed only when the actors span
several nodes, so on one machine they never import torch nor open a port.  With ``transport="tcp"`` they do
the same on each node, and between nodes each actor listens on a TCP port the OS picks on its node's address
and the actors connect to each other's (``casync.transport.sockets``): no process group at all.
"""
from __future__ import annotations

import os
import socket
import sys
import uuid
from typing import Any, Callable

import ray

from ..engines.collector import freeze_setup_heap
from ..plan.syncplan import SyncPlan
from ..schedule import plan_transfers
from ..transport.base import RoutedChannel
from ..transport.shm import SHM_DIR, Arena, ShmChannel, arena_name, arenas
from ..transport.sockets import SocketChannel
from ..transport.torchdist import TorchChannel, init_group, interface_of, listen_socket
from .actor_process import ActorProcess


class DataPlaneMember(ActorProcess):
    """Mixed into an actor class: joins the group and builds its channel; ``_on_channel(channel)`` takes it, and
    the set-up heap is then frozen out of the garbage collector (``casync.engines.collector``)."""

    timeout_s: float
    name: str
    _channel: Any = None
    _sockets: SocketChannel | None = None
    _far_sockets: SocketChannel | None = None  # TCP to the other nodes' actors (transport "tcp")
    _rendezvous: socket.socket | None = None  # rank 0's listening socket, from rendezvous to connect

    def rendezvous(self, port: int | None) -> tuple[str, int]:
        """Where the group meets: this actor's node address and a port (the configured one, or one the OS
        picks) it listens on from now until its :meth:`connect` hands the socket to the group."""
        host = ray.util.get_node_ip_address()
        self._rendezvous = listen_socket(host, port or 0)
        return host, int(self._rendezvous.getsockname()[1])

    def connect(self, ranks: dict[str, int], master: str | None, port: int | None, backend: str | None,
                ifname: str | None, shm: tuple[dict[str, Arena], str] | None = None,
                near: tuple[list[str], str] | None = None, far_tcp: list[str] | None = None) -> str:
        """Join the group (every actor calls this at once; ``backend`` None: no process group), with ``shm``
        (arena layout, name prefix) create this actor's shared-memory arena, with ``near`` (the peers on
        this node, a name prefix) listen for their sockets, and with ``far_tcp`` (the peers on other nodes)
        listen for their TCP connections (:meth:`tcp_address`); returns the network interface gloo uses (""
        when there is no process group)."""
        far: Any = None
        if far_tcp:
            self._far_sockets = far = SocketChannel(self.name, far_tcp, "", self.timeout_s,
                                                    host=ray.util.get_node_ip_address())
        if backend is not None:
            listening, self._rendezvous = self._rendezvous, None
            ifname = ifname or os.environ.get("GLOO_SOCKET_IFNAME") or interface_of(ray.util.get_node_ip_address())
            init_group(ranks[self.name], len(ranks), master, port, backend=backend, timeout_s=self.timeout_s,
                       ifname=ifname, listen_fd=None if listening is None else listening.detach())
            far = TorchChannel(self.name, ranks)
        channel = far
        if near is not None and near[0]:
            self._sockets = SocketChannel(self.name, near[0], near[1], self.timeout_s)
            channel = RoutedChannel(self.name, self._sockets, near[0], far)
        if shm is not None:
            channel = ShmChannel(channel, self.name, shm[0], shm[1])
        self._channel = channel
        self._on_channel(channel)
        freeze_setup_heap()  # set up: a full collection inside a step would traverse all of it
        return (ifname or "") if backend is not None else ""

    def _on_channel(self, channel: Any) -> None:
        raise TypeError(f"{type(self).__name__} must define _on_channel")

    def tcp_address(self) -> tuple[str, int] | None:
        """Where this actor listens for the other nodes' actors (transport "tcp"; None otherwise)."""
        return self._far_sockets.address if self._far_sockets is not None else None

    def attach(self, addresses: dict[str, tuple[str, int]] | None = None) -> None:
        """Connect to the same-node peers' sockets and map their arenas (every actor made its own first), and
        with ``addresses`` (every actor's :meth:`tcp_address`) to the other nodes' actors."""
        if self._far_sockets is not None:
            self._far_sockets.connect(addresses)
        if self._sockets is not None:
            self._sockets.connect()
        if isinstance(self._channel, ShmChannel):
            self._channel.attach()

    def unlink(self) -> None:
        """Remove this actor's arena name once every peer mapped it (nothing leaks if a process dies)."""
        if isinstance(self._channel, ShmChannel):
            self._channel.unlink()

    def leave(self) -> None:
        """Take this actor out of its data plane so that it can join a new one (``RayEngine.replan``): every
        actor of the group calls this at once.  Sockets are shut (their reader threads end), arenas unmapped
        (their names were unlinked at formation), the process group destroyed.  The caller drops whatever held
        views of the arenas (its executor) first; the set-up heap is unfrozen so that the old executor's cycles
        are collected, and :meth:`connect` freezes the new one."""
        import gc

        gc.unfreeze()
        gc.collect()  # the old executor's lanes stop when it is collected (casync.engines.lanes.stop_lanes)
        channel, self._channel = self._channel, None
        for sockets in (self._sockets, self._far_sockets):
            if sockets is not None:
                sockets.close()
        self._sockets = self._far_sockets = None
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None
        if isinstance(channel, ShmChannel):
            channel.close()  # a view of an arena that outlived its executor raises BufferError: loud, not leaked
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def form_group(actors: dict[str, Any], plans: list[tuple[SyncPlan, int]], transport: str, options: dict[str, Any],
               get: Callable[[list[Any], str], list[Any]]) -> dict[str, str]:
    """Form the data plane of ``actors`` (names in rank order) for ``plans`` (each with the number its transfer
    ids start at, as in ``actor_shares``); returns each actor's network interface.

    ``get`` is the engine's ``ray.get`` with its timeout and failure mapping."""
    names = list(actors)
    ranks = {name: rank for rank, name in enumerate(names)}
    backend: str | None = "nccl" if transport == "nccl" else "gloo"
    shm, near, far_tcp = None, {n: None for n in names}, {n: None for n in names}
    if transport in ("direct", "tcp"):
        nodes = dict(zip(names, get([actors[n].node_id.remote() for n in names], "locating the actors")))
        prefix = f"casync{os.getpid()}x{uuid.uuid4().hex[:8]}"
        # one slot per transfer of every plan the actors run (a Trainer's full-precision plan too)
        layout = arenas([t for plan, base in plans for t in plan_transfers(plan, base)], nodes)
        shm = (layout, prefix) if layout else None
        near = {n: ([p for p in names if p != n and nodes[p] == nodes[n]], prefix) for n in names}
        if transport == "tcp":
            far_tcp = {n: [p for p in names if nodes[p] != nodes[n]] for n in names}
        if transport == "tcp" or len(set(nodes.values())) == 1:
            backend = None  # sockets and shared memory carry everything (one machine: no port is opened)
    master, port, where = None, None, "connecting the actors"
    if backend is not None:
        master, port = get([actors[names[0]].rendezvous.remote(options.get("port"))], "starting the data plane")[0]
        where = f"forming the {backend} process group at {master}:{port}"
    try:
        interfaces = dict(zip(names, get([actors[n].connect.remote(ranks, master, port, backend,
                                                                   options.get("ifname"), shm, near[n], far_tcp[n])
                                          for n in names], where)))
        if transport in ("direct", "tcp"):
            addresses = None
            if transport == "tcp":
                addresses = dict(zip(names, get([actors[n].tcp_address.remote() for n in names],
                                                 "listening for TCP")))
            get([a.attach.remote(addresses) for a in actors.values()], "connecting the actors")
        if shm is not None:
            get([a.unlink.remote() for a in actors.values()], "mapping shared memory")
    except BaseException:
        if shm is not None:  # the arenas made so far would outlive the actors (killed, they unlink nothing)
            remove_arenas(actors, shm[0], shm[1])
        raise
    return interfaces


def remove_arenas(actors: dict[str, Any], layout: dict[str, Arena], prefix: str, wait_s: float = 2.0) -> None:
    """Best effort after a failed formation: every actor that still answers unlinks its arena, and the names
    left in this machine's shared memory (actors on the driver's node that are dead or stuck) are removed here."""
    refs = [a.unlink.remote() for a in actors.values()]
    try:
        ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    except Exception:
        pass
    for name in layout:
        try:
            os.unlink(os.path.join(SHM_DIR, arena_name(prefix, name)))
        except OSError:
            pass
