"""Unix sockets between the actors of one machine (``casync.transport.sockets``): framing, order, failures,
and the executor over them (with shared memory, and routed beside another channel between machines)."""
from __future__ import annotations

import os
import threading
import time
import uuid

import numpy as np
import pytest

import casync
from casync.errors import SyncError, SyncTimeoutError, WorkerLostError
from casync.schedule import plan_transfers
from casync.transport.base import LocalHub, RoutedChannel
from casync.transport.shm import ShmChannel, arenas
from casync.transport.sockets import SocketChannel
from tests.engines.test_executor import SHAPES, check_hub_against_local_engine, executors


def connected(actors, timeout_s=10.0, groups=None, tcp=False, peers=None):
    """A SocketChannel per actor, each connected to the others of its group (all of ``actors`` by default) or,
    with ``peers``, to the actors it maps each one to; ``tcp``: over TCP on loopback, as between machines,
    instead of Unix sockets."""
    prefix = f"casynctest{os.getpid()}x{uuid.uuid4().hex[:6]}"
    if peers is None:
        peers = {a: g for g in (groups or [list(actors)]) for a in g}
    host = "127.0.0.1" if tcp else None
    channels = {a: SocketChannel(a, p, prefix, timeout_s, host=host) for a, p in peers.items()}
    addresses = {a: c.address for a, c in channels.items()} if tcp else None
    errors = []

    def connect(channel):
        try:
            channel.connect(addresses)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=connect, args=(c,)) for c in channels.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    return channels


@pytest.fixture(params=["unix", "tcp"])
def pair(request):
    channels = connected(["worker:0", "worker:1"], timeout_s=5.0, tcp=request.param == "tcp")
    yield channels["worker:0"], channels["worker:1"]
    for c in channels.values():
        c.close()


def test_messages_of_one_tag_arrive_in_order_whether_posted_before_or_after(pair):
    a, b = pair
    early = [np.empty(3, np.int64) for _ in range(2)]
    posted = [b.irecv(buf, "worker:0", 7) for buf in early]  # posted before anything was sent
    for i in range(4):
        a.isend(np.arange(3, dtype=np.int64) + 10 * i, "worker:1", 7)
    a.isend(np.full(5, 2.5, np.float32), "worker:1", 9)
    for handle in posted:
        handle.wait()
    late = [np.empty(3, np.int64) for _ in range(2)]
    time.sleep(0.05)  # these messages have arrived before their receives are posted
    for buf in late:
        b.irecv(buf, "worker:0", 7).wait()
    other = np.empty(5, np.float32)
    b.irecv(other, "worker:0", 9).wait()
    assert [list(x) for x in early + late] == [[0, 1, 2], [10, 11, 12], [20, 21, 22], [30, 31, 32]]
    assert (other == 2.5).all()


def test_large_messages_both_ways_at_once_do_not_deadlock(pair):
    """Bodies far over a socket's buffer, sent by both ends at the same time (each end's reader drains)."""
    a, b = pair
    n = 4 << 20
    data = {c.actor: np.random.default_rng(i).standard_normal(n).astype(np.float32) for i, c in enumerate(pair)}
    got = {c.actor: np.empty(n, np.float32) for c in pair}
    handles = {c.actor: c.irecv(got[c.actor], peer, 1) for c, peer in ((a, "worker:1"), (b, "worker:0"))}
    senders = [threading.Thread(target=c.isend, args=(data[c.actor], peer, 1))
               for c, peer in ((a, "worker:1"), (b, "worker:0"))]
    for t in senders:
        t.start()
    for t in senders:
        t.join(20)
    for handle in handles.values():
        handle.wait()
    assert np.array_equal(got["worker:0"], data["worker:1"]) and np.array_equal(got["worker:1"], data["worker:0"])


def test_a_message_of_the_wrong_size_is_an_error_naming_peer_and_tag(pair):
    a, b = pair
    handle = b.irecv(np.empty(4, np.uint8), "worker:0", 3)
    a.isend(np.zeros(6, np.uint8), "worker:1", 3)
    with pytest.raises(SyncError, match=r"6 bytes from worker:0 \(tag 3\) for a buffer of 4"):
        handle.wait()
    a.isend(np.zeros(6, np.uint8), "worker:1", 3)  # arrives before its receive is posted: the wait raises
    time.sleep(0.05)
    with pytest.raises(SyncError, match=r"6 bytes from worker:0 \(tag 3\) for a buffer of 4"):
        b.irecv(np.empty(4, np.uint8), "worker:0", 3).wait()
    a.isend(np.ones(4, np.uint8), "worker:1", 3)  # the stream is still in step: the next message is intact
    buf = np.empty(4, np.uint8)
    b.irecv(buf, "worker:0", 3).wait()
    assert (buf == 1).all()


def test_a_peer_that_goes_away_fails_waiting_and_later_receives_at_once(pair):
    a, b = pair
    handle = b.irecv(np.empty(8, np.uint8), "worker:0", 1)
    t0 = time.monotonic()
    a.close()  # as a killed process's sockets are
    with pytest.raises(WorkerLostError, match="worker:0 closed its connection"):
        handle.wait()
    assert time.monotonic() - t0 < 2.0  # not the 5 s timeout
    with pytest.raises(WorkerLostError, match="worker:0"):
        b.irecv(np.empty(8, np.uint8), "worker:0", 2)


def test_a_peer_that_dies_mid_body_fails_the_receive_it_was_filling_at_once(pair):
    """The receive whose body was being read when the connection ended fails as the others do (not a timeout)."""
    from casync.transport.sockets import _FRAME

    a, b = pair
    handle = b.irecv(np.empty(1000, np.uint8), "worker:0", 5)
    a._out["worker:1"].sendall(_FRAME.pack(5, 1000) + b"x" * 10)  # the header and 10 of 1000 bytes
    time.sleep(0.1)
    t0 = time.monotonic()
    a.close()
    with pytest.raises(WorkerLostError, match="worker:0 closed its connection"):
        handle.wait()
    assert time.monotonic() - t0 < 2.0  # not the 5 s timeout


def test_a_corrupt_frame_fails_the_receives_at_once(pair):
    from casync.transport.sockets import _FRAME

    a, b = pair
    handle = b.irecv(np.empty(8, np.uint8), "worker:0", 5)
    a._out["worker:1"].sendall(_FRAME.pack(5, -1))
    t0 = time.monotonic()
    with pytest.raises(SyncError, match="stream from worker:0 broke"):
        handle.wait()
    assert time.monotonic() - t0 < 2.0


def test_close_ends_the_reader_threads_while_the_peer_lives(pair):
    a, b = pair
    a.close()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(t.name == "casync-socket-worker:0<-worker:1"
                                              for t in threading.enumerate()):
        time.sleep(0.02)
    assert not [t for t in threading.enumerate() if t.name == "casync-socket-worker:0<-worker:1"]


def test_silence_is_a_timeout_and_abort_fails_a_waiting_receive(pair):
    a, b = pair
    b.timeout_s = 0.3
    with pytest.raises(SyncTimeoutError, match=r"worker:1: nothing from worker:0 \(tag 4\) within 0.3s"):
        b.irecv(np.empty(8, np.uint8), "worker:0", 4).wait()
    handle = b.irecv(np.empty(8, np.uint8), "worker:0", 5)
    threading.Timer(0.1, b.abort, ("a peer failed",)).start()
    with pytest.raises(SyncError, match="aborted: a peer failed"):
        handle.wait()
    with pytest.raises(SyncError, match="aborted"):
        b.isend(np.zeros(1, np.uint8), "worker:0", 1)


def test_abort_tells_the_peers_so_their_receives_fail_at_once(pair):
    """An actor that aborts (its op failed, say) tells its peers: what it sent before still arrives, a receive
    waiting on it then fails within moments naming its reason, not at the timeout, and so does every later one."""
    a, b = pair
    b.timeout_s = 30.0
    a.isend(np.arange(4, dtype=np.int64), "worker:1", 1)
    waiting = b.irecv(np.empty(8, np.uint8), "worker:0", 2)
    t0 = time.monotonic()
    threading.Timer(0.1, a.abort, ("worker:0 failed in step 3: ValueError: bad input",)).start()
    with pytest.raises(SyncError, match="worker:0 aborted its data plane: worker:0 failed in step 3"):
        waiting.wait()
    assert time.monotonic() - t0 < 5
    sent = np.empty(4, np.int64)
    b.irecv(sent, "worker:0", 1).wait()  # came before the abort frame
    assert sent.tolist() == [0, 1, 2, 3]
    with pytest.raises(SyncError, match="aborted its data plane"):
        b.irecv(np.empty(8, np.uint8), "worker:0", 3).wait()
    with pytest.raises(SyncError, match="aborted"):  # and the aborted end refuses to send
        a.isend(np.zeros(1, np.uint8), "worker:1", 4)


def test_an_actor_that_is_not_a_peer_is_refused(pair):
    with pytest.raises(SyncError, match="no socket to 'worker:7'"):
        pair[0].isend(np.zeros(1, np.uint8), "worker:7", 1)


@pytest.mark.parametrize("strategy", ["ring", "ps", "allgather"])
def test_executors_over_sockets_and_shared_memory_are_local_engines(strategy):
    """One machine as RayEngine's default transport runs it: bodies in shared memory, the rest over sockets."""
    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, bucket_bytes=600, strategy=strategy)
    actors = plan.actors
    layout = arenas(plan_transfers(plan), {a: "n0" for a in actors})
    sockets = connected(actors)
    prefix = f"casynctest{os.getpid()}x{uuid.uuid4().hex[:6]}"
    channels = {a: ShmChannel(sockets[a], a, layout, prefix) for a in actors}
    try:
        for c in channels.values():
            c.attach()
        for c in channels.values():
            c.unlink()
        check_hub_against_local_engine(plan, 1, execs=executors(plan, None, channel=channels.__getitem__))
    finally:
        for c in [*channels.values(), *sockets.values()]:
            c.close()


def test_sockets_on_each_machine_and_another_channel_between_them():
    """Two machines of two actors: same-machine messages over sockets, the others over the base channel."""
    plan = casync.build_plan(SHAPES, workers=4, codec="topk:ratio=0.2", partitions=4, bucket_bytes=600,
                             strategy="ring")
    actors = plan.actors
    machines = [actors[:2], actors[2:]]
    sockets = connected(actors, groups=machines)
    hub = LocalHub(timeout_s=10)
    near = {a: [p for p in m if p != a] for m in machines for a in m}
    channels = {a: RoutedChannel(a, sockets[a], near[a], hub.channel(a)) for a in actors}
    try:
        check_hub_against_local_engine(plan, 1, execs=executors(plan, None, channel=channels.__getitem__))
    finally:
        for c in channels.values():
            c.close()
    with pytest.raises(SyncError, match="not on this machine and no channel between machines"):
        RoutedChannel(actors[0], sockets[actors[0]], near[actors[0]], None).isend(np.zeros(1), actors[3], 1)


def test_unix_sockets_on_each_machine_and_tcp_between_them():
    """RayEngine's "tcp" data plane in one process: two machines of two actors, Unix sockets within a machine
    and TCP sockets to the other machine's actors; the executors match LocalEngine."""
    plan = casync.build_plan(SHAPES, workers=4, codec="onebit", partitions=4, bucket_bytes=600, strategy="ring")
    actors = plan.actors
    machines = [actors[:2], actors[2:]]
    near = connected(actors, groups=machines)
    far = connected(actors, tcp=True, peers={a: [p for m in machines if a not in m for p in m] for a in actors})
    neighbours = {a: [p for p in m if p != a] for m in machines for a in m}
    channels = {a: RoutedChannel(a, near[a], neighbours[a], far[a]) for a in actors}
    try:
        check_hub_against_local_engine(plan, 2, execs=executors(plan, None, channel=channels.__getitem__))
    finally:
        for c in channels.values():
            c.close()
