"""The process group's rendezvous (``casync.transport.torchdist``): its port is held from the moment it is chosen."""
from __future__ import annotations

import socket

import pytest

from casync.transport.torchdist import init_group, listen_socket

pytest.importorskip("torch")


def test_the_rendezvous_port_is_held_until_the_group_takes_it_over():
    """Choosing a free port and binding it later raced with other processes (EADDRINUSE in a busy suite): the
    socket that chose the port listens on it until the group's store adopts it."""
    held = listen_socket("127.0.0.1")
    port = held.getsockname()[1]
    with pytest.raises(OSError):
        socket.create_server(("127.0.0.1", port))  # nobody else can take it meanwhile
    dist = init_group(0, 1, "127.0.0.1", port, timeout_s=20, listen_fd=held.detach())
    try:
        assert dist.get_world_size() == 1
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # the group's store listens there now
            pass
    finally:
        dist.destroy_process_group()
