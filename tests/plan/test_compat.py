"""What is already on disk keeps working: plan files of format 1 and Trainer checkpoints written before the
layout changed (files made by the earlier code, kept in tests/data)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import casync
from casync.cli import strategy_table
from casync.plan.io import PLAN_VERSION

DATA = Path(__file__).resolve().parents[1] / "data"
README = Path(__file__).resolve().parents[2] / "README.md"


def test_a_format_1_plan_file_loads_as_the_same_plan():
    old = json.loads((DATA / "plan_v1.json").read_text())
    assert old["version"] == 1 and "tensor" in old["graph"]["nodes"][0][1]
    loaded = casync.SyncPlan.load(DATA / "plan_v1.json")
    # the file was built with error_feedback=True, then the default; today's default ("auto") builds the same graph
    rebuilt = casync.build_plan("tiny", workers=3, strategy="ps", servers=1, codec="topk:ratio=0.1", partitions=2,
                                error_feedback=True)
    assert loaded == rebuilt
    default = casync.build_plan("tiny", workers=3, strategy="ps", servers=1, codec="topk:ratio=0.1", partitions=2)
    assert loaded.to_dict()["graph"] == default.to_dict()["graph"] and loaded.buckets == default.buckets
    assert loaded.to_dict()["version"] == PLAN_VERSION == 2


def test_a_format_1_plan_syncs_as_built(grads_factory):
    plan = casync.SyncPlan.load(DATA / "plan_v1.json")
    grads = grads_factory({t.name: t.shape for t in plan.tensors}, plan.workers)
    want = casync.LocalEngine(casync.build_plan("tiny", workers=3, strategy="ps", servers=1, codec="topk:ratio=0.1",
                                                partitions=2)).sync(grads)
    got = casync.LocalEngine(plan).sync(grads)
    for w in range(plan.workers):
        for name in want[w]:
            assert np.array_equal(got[w][name], want[w][name])


def test_readme_strategy_table_is_the_registry():
    assert strategy_table(markdown=True) in README.read_text()


@pytest.mark.slow
def test_a_trainer_checkpoint_from_before_continues_bit_for_bit(ray_local):
    """Saved at step 3 by the earlier code, which then trained 2 more steps: loading it now and training 2
    steps gives the very same parameters."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from casync.datasets.digits import SGD, DigitsData, DigitsMLP, cross_entropy

    fns = (DigitsMLP((64, 16, 10)), SGD(lr=0.1, momentum=0.9), cross_entropy, DigitsData(batch_size=16, seed=0))
    expected = np.load(DATA / "trainer_checkpoint_v1" / "params_after_5_steps.npz")
    with casync.Trainer.load(str(DATA / "trainer_checkpoint_v1" / "checkpoint"), *fns, progress=False) as trainer:
        assert trainer.step == 3
        trainer.fit(steps=2)
        params = {k: v.detach().numpy() for k, v in trainer.model().state_dict().items()}
    assert params.keys() == set(expected.files)
    for name in expected.files:
        assert np.array_equal(params[name], expected[name]), name
