"""benchmarks/p2p_cpu.py: both ends of each transport report their CPU for the messages they streamed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from casync.bench.setup import _free_local_port

# appended, not first: benchmarks/codecs.py must not shadow the standard library's codecs; on sys.path at all
# because the script's spawned ends import it by name
sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))

import p2p_cpu  # noqa: E402


@pytest.mark.parametrize("transport", ["gloo", "tcp"])
def test_each_transport_streams_its_messages_and_reports_both_ends(transport):
    row = p2p_cpu.measure(4000, 20, transport, port=_free_local_port())
    assert row["transport"] == transport and row["messages"] == 20
    assert row["sender_cpu_us"] > 0 and row["receiver_cpu_us"] > 0
    assert row["cpu_us_per_message"] == pytest.approx(row["sender_cpu_us"] + row["receiver_cpu_us"])
    assert 0 < row["wall_us_per_message"] < 1e6
