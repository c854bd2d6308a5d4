"""Results through shared memory (``casync.runtime.shared_results``): the two ends in one process."""
from __future__ import annotations

import os

import numpy as np

from casync.runtime.shared_results import SHM_DIR, MappedResults, SharedResults, room_for

def test_the_driver_sees_what_the_actor_writes_and_no_name_is_left():
    sizes = {"bucket0": 1000, "bucket1": 7, "empty": 0}
    actor = SharedResults(f"casync-test-{os.getpid()}", sizes)
    driver = MappedResults(actor.name, sizes)
    # one process plays both ends: the driver's end left the actor's registration with the tracker alone
    actor.unlink()  # both have it mapped: the name can go
    assert not os.path.exists(os.path.join(SHM_DIR, actor.name))
    for step in range(2):  # the same buffers, step after step
        for b, buf in actor.buffers.items():
            buf[...] = np.arange(buf.size, dtype=np.float32) + 10 * step
        for b, n in sizes.items():
            np.testing.assert_array_equal(driver.buffers[b], np.arange(n, dtype=np.float32) + 10 * step)
    assert {b: v.shape for b, v in driver.buffers.items()} == {b: (n,) for b, n in sizes.items()}
    driver.close()
    actor.shm.close()


def test_room_is_checked_before_a_segment_is_made():
    """A segment is sparse: without room, writing into it would kill the actor (SIGBUS), so it is not made."""
    assert room_for(1)
    assert not room_for(1 << 62)
    assert not room_for(1, directory="/nonexistent")
