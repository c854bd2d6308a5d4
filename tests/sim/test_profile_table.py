"""`casync profile` prints what it measured beside the packaged profile (casync.sim.profile_table)."""
from __future__ import annotations

from dataclasses import replace

from casync.sim.costmodel import LinearCost, Profile, RuntimeCosts
from casync.sim.profile_table import codec_rows, machine_rows


def test_each_measured_codec_beside_its_packaged_costs():
    packaged = Profile.default()
    onebit = packaged.codecs["onebit"]
    slower = {"encode": LinearCost(2 * onebit["encode"].a, onebit["encode"].b),
              "decode": LinearCost(onebit["decode"].a, 2 * onebit["decode"].b)}
    measured = replace(packaged, codecs={"onebit": slower, "mine": slower})
    headers, body = codec_rows(measured, packaged)
    assert headers[:3] == ["codec", "encode a (us)", "packaged"] and "decode ÷ packaged" in headers
    row = dict(zip(headers, body[0]))  # duplicate header names: the last "packaged" is decode's
    assert body[0][0] == "onebit"
    assert body[0][1] == f"{2 * onebit['encode'].a * 1e6:.1f}" and body[0][2] == f"{onebit['encode'].a * 1e6:.1f}"
    assert row["decode ÷ packaged"] == "0.50"  # twice the time per element: half the throughput
    assert body[1][0] == "mine" and body[1][2] == body[1][4] == body[1][6] == body[1][7] == ""  # nothing to compare


def test_machine_terms_and_a_calibrated_runtime_beside_the_packaged_ideal_one():
    packaged = Profile.default()
    measured = replace(packaged, merge=LinearCost(0.0, 3 * packaged.merge.b))
    headers, body = machine_rows(measured, packaged)
    terms = {row[0]: row for row in body}
    assert headers == ["term", "measured", "packaged", "measured ÷ packaged"]
    assert terms["merge (ns/element)"][3] == "3.00" and "hop a (ms)" not in terms  # no runtime measured
    runtime = RuntimeCosts(compute_scale=1.5, task_gap_s=0.0, hop=LinearCost(2e-3, 0.0), plane="direct",
                           op_gap_s=3e-5, message_cpu_s=1e-4, copy_cpu={"shm": 2e-10}, sync_cpu_s=4e-3,
                           backward_cores=0.9)
    terms = {row[0]: row for row in machine_rows(measured.with_runtime(runtime), packaged)[1]}
    assert terms["ops' time in loaded actors (×)"][1:] == ["1.500", "1.000", "1.50"]
    assert terms["hop a (ms)"][1:] == ["2.000", "0.000", ""]  # the ideal runtime has none: no ratio
    assert terms["executor per op (us)"][1] == "30.000" and terms["other CPU per sync (ms)"][1] == "4.000"
    assert terms["executor per message (ms)"][1] == "0.100" and terms["copy CPU, shm (ns/byte)"][1] == "0.200"
    assert terms["copy CPU, gloo (ns/byte)"][1] == "" and terms["backward's cores"][1:3] == ["0.900", "0.000"]
