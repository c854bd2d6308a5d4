"""Where did my tensor go: the summary names each bucket's tensors, explain() tells one tensor's story."""
from __future__ import annotations

import pytest

import casync
from casync.plan.explain import members_label
from casync.sim.costmodel import ClusterModel


def test_summary_shows_each_buckets_tensors():
    plan = casync.build_plan("resnet50", workers=4, codec="onebit")
    text = plan.summary()
    for b in plan.buckets:
        line = next(row for row in text.splitlines() if row.startswith(b.name + " "))
        assert f"{len(b.members)}: " in line
        names = b.tensor_names
        assert names[0] in line and names[-1] in line  # first and last tensor, in bucket order
    assert f"TOTAL    {len(plan.tensors)}" in text


def test_members_label_shortens_long_names():
    plan = casync.build_plan({"a" * 60: (10,), "b": (5,)}, workers=2, codec="none")
    label = members_label(plan.buckets[0])
    assert label.startswith("2: …") and label.endswith(" … b") and len(label) < 45


def test_explain_a_tensor_of_a_planned_plan():
    cluster = ClusterModel.for_workers(8, bandwidth_gbps=1)
    plan = casync.build_plan("resnet50", workers=8, strategy="auto", codec="auto", partitions="auto", cluster=cluster)
    name = "layer4.2.conv3.weight"
    bucket, member = plan.locate(name)
    text = plan.explain(name)
    assert text.startswith(f"tensor {name}: 1,048,576 elements (2048x512x1x1)")
    assert f"bucket      {bucket.name} " in text
    assert f"elements [{member.offset:,}, {member.stop:,}) of {bucket.numel:,}" in text
    assert f"strategy    {casync.get_strategy(bucket.strategy).label(bucket)}" in text
    assert f"codec       {bucket.codec}" in text
    assert f"partitions  {len(bucket.partitions)} of " in text
    wire = plan.wire_bytes(bucket.name)
    assert "wire        " in text and (f"{wire:,} B" in text or f"{wire / 2**20:.1f} MiB" in text
                                        or f"{wire / 2**10:.1f} KiB" in text)
    assert bucket.note and f"why         planner: {bucket.note}" in text


def test_explain_a_fixed_plan_names_the_callers_choice_and_error_feedback():
    plan = casync.build_plan("resnet50", workers=4, strategy="ps", codec="terngrad", bucket_bytes=0)
    text = plan.explain("fc.bias")
    assert "codec       terngrad, with error feedback on its contractive version" in text
    assert "why         chosen by the caller (strategy='ps', codec=terngrad" in text
    assert "in partition 0" in text
    plain = casync.build_plan("resnet50", workers=4, codec="onebit", error_feedback=False).explain("fc.bias")
    assert "onebit, without error feedback" in plain


def test_explain_a_bucket_and_unknown_names():
    plan = casync.build_plan("resnet50", workers=4, codec="onebit")
    assert plan.explain("bucket0").startswith(f"bucket bucket0: {plan.buckets[0].numel:,} elements, "
                                              f"{len(plan.buckets[0].members)}: ")
    with pytest.raises(KeyError, match="did you mean 'layer4.2.conv3.weight'"):
        plan.explain("layer4.2.conv3.weigth")
    with pytest.raises(TypeError, match="tensor or bucket name"):
        plan.explain(3)
