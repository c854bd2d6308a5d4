"""Shared memory on a machine whose /dev/shm is small (Docker's default is 64 MB): a segment is sparse, so one
made without room kills whoever writes into it with SIGBUS.  Arenas that find no room leave their bodies to the
sockets; a results segment that finds none is refused (the actor returns its results through Ray).

Each case runs in a child process with a small tmpfs of its own over /dev/shm (a private mount namespace:
``unshare -m``, root only; skipped elsewhere)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _small_shm(code: str, size: str = "8M", timeout: float = 120) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1M tmpfs /dev/shm"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot mount a private /dev/shm here (needs root)")
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} -c \"$0\""
    return subprocess.run(["unshare", "-m", "sh", "-c", script, textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_arenas_without_room_leave_the_bodies_to_the_sockets():
    """Three actors whose arenas (10 MB each) do not fit an 8 MB /dev/shm: results as LocalEngine's, no SIGBUS."""
    result = _small_shm("""
        import os, uuid
        import casync
        from casync.schedule import plan_transfers
        from casync.transport.shm import ShmChannel, arenas
        from tests.transport.test_sockets import connected
        from tests.engines.test_executor import executors, check_hub_against_local_engine
        from tests.helpers import make_grads
        shapes = {"w": (1_000_000,)}
        plan = casync.build_plan(shapes, workers=3, codec="none", strategy="ring")
        layout = arenas(plan_transfers(plan), {a: "n0" for a in plan.actors})
        assert all(2 * arena.half > 8 << 20 for arena in layout.values())
        sockets = connected(plan.actors)
        prefix = f"casynctest{os.getpid()}x{uuid.uuid4().hex[:6]}"
        channels = {a: ShmChannel(sockets[a], a, layout, prefix) for a in plan.actors}
        assert all(c.no_arena for c in channels.values())
        for c in channels.values():
            c.attach()
        for c in channels.values():
            c.unlink()
        check_hub_against_local_engine(plan, 1, make=lambda s: make_grads(shapes, 3, seed=s),
                                       execs=executors(plan, None, channel=channels.__getitem__))
        print("matches LocalEngine")
    """)
    assert result.returncode == 0 and "matches LocalEngine" in result.stdout, (result.returncode, result.stderr[-2000:])


def test_a_results_segment_without_room_is_refused_not_made_sparse():
    """Each of two 3 MB segments passes room_for on a 5 MB /dev/shm when checked alone (as actors of one machine
    check at once); the second must be refused, not made sparse (writing it would be a SIGBUS)."""
    result = _small_shm("""
        import os
        from casync.runtime.shared_results import NoRoomError, SharedResults, room_for
        sizes = {"b": 750_000}  # 3 MB
        assert room_for(4 * 750_000)
        first = SharedResults(f"casync-test-{os.getpid()}-a", sizes)
        first.buffers["b"][...] = 1.0
        try:
            second = SharedResults(f"casync-test-{os.getpid()}-b", sizes)
        except NoRoomError:
            print("refused")
        else:
            second.buffers["b"][...] = 1.0  # SIGBUS
            print("written")
        first.unlink()
    """, size="5M")
    assert result.returncode == 0 and "refused" in result.stdout, (result.returncode, result.stderr[-2000:])
