"""``casync profile``'s transfer costs between two processes of this node, on the direct plane."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from casync.runtime.transfer import profile_transfer


def test_direct_transfer_costs_are_measured_between_processes():
    alpha, beta, overhead = profile_transfer(sizes=(2**20, 2**23), repeat=1, transport="direct")
    assert 0 < alpha < 0.05  # a header's one-way trip over the Unix sockets, between two spawned processes
    assert 1e8 < beta < 1e12  # bytes per second of a copy into mapped memory
    assert 0 < overhead < 0.05  # the executor's own seconds per task


def test_an_unknown_transport_is_refused_by_name():
    with pytest.raises(ValueError, match="'gloo'"):
        profile_transfer(transport="gloo")


def test_a_probe_whose_processes_die_fails_at_once(tmp_path):
    """Spawned processes re-import ``__main__``: from a script on stdin they cannot, and die at start.  The probe
    says so within seconds instead of waiting out its two-minute deadline."""
    script = "from casync.runtime.transfer import profile_transfer\nprofile_transfer(sizes=(2**20,), repeat=1)\n"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-"], input=script, text=True, capture_output=True, cwd=tmp_path,
                          timeout=110)
    assert done.returncode != 0 and "gave no result" in done.stderr
    assert time.monotonic() - start < 60
