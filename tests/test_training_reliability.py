"""casync.Trainer when things go wrong: NaN/Inf in one worker's gradient under each ``nonfinite`` mode, bad
input to the Trainer, and a worker killed mid-fit followed by a bit-identical resume from the checkpoint."""
from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
ray = pytest.importorskip("ray")

import ray.cloudpickle  # noqa: E402

import casync  # noqa: E402
from casync.training.digits import SGD, DigitsData, DigitsMLP, cross_entropy  # noqa: E402

# functions defined here travel to the worker actors by value (this module is not importable there)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SMALL = DigitsMLP((64, 24, 10))  # parameters '1.weight', '1.bias', '3.weight', '3.bias'
CPUS = 0.25
POISONED = "3.bias"


@dataclass(frozen=True)
class PoisonedDigits:
    """Digits shards whose batches carry a third item, ``poison``: 0, except on worker ``rank``'s batch number
    ``index`` of each epoch, where it is ``value`` (NaN or Inf)."""

    rank: int
    index: int
    value: float

    def __call__(self, rank, world_size):
        x, y = DigitsData(batch_size=128, shuffle=False).train
        shard = np.arange(rank, len(y), world_size)
        batches = []
        for i, start in enumerate(range(0, len(shard) - 127, 128)):
            rows = shard[start:start + 128]
            poison = self.value if (rank, i) == (self.rank, self.index) else 0.0
            batches.append((torch.from_numpy(x[rows]), torch.from_numpy(y[rows]), torch.tensor(poison)))
        return batches


def poisoned_loss(model, batch):
    """Cross-entropy, plus ``poison * sum(last bias)``: only that bias's gradient turns NaN/Inf."""
    x, y, poison = batch
    return cross_entropy(model, (x, y)) + (model[3].bias * poison).sum()


def trainer_for(mode, value, **kw):
    return casync.Trainer(SMALL, SGD(lr=0.1, momentum=0.9), poisoned_loss, PoisonedDigits(1, 2, value), workers=2,
                          codec="onebit", nonfinite=mode, progress=False, timeout_s=60, cpus_per_worker=CPUS, **kw)


def worker_states(trainer):
    """Every worker's parameters, optimizer momentum and error-feedback residuals, as NumPy."""
    out = []
    for state in trainer._engine.call("export_state", True):
        momentum = {k: v["momentum_buffer"] for k, v in state["optimizer"]["state"].items()}
        out.append({"model": state["model"], "momentum": momentum, "residuals": state["residuals"]})
    return out


def assert_states_equal(a, b):
    for wa, wb in zip(a, b, strict=True):
        for part in ("model", "momentum", "residuals"):
            assert wa[part].keys() == wb[part].keys(), part
            for k in wa[part]:
                np.testing.assert_array_equal(wa[part][k], wb[part][k], err_msg=f"{part} {k}")


# -- NaN / Inf in one worker's gradient ---------------------------------------------------------------------
def test_nonfinite_raise_names_step_worker_parameter_and_changes_nothing(ray_local):
    with trainer_for("raise", float("inf")) as trainer:
        trainer.fit(steps=2)
        before = worker_states(trainer)
        with pytest.raises(casync.NonFiniteGradientError,
                           match=rf"step 2: .*worker 1, tensor '{POISONED}': 0 NaN, 10 Inf") as info:
            trainer.fit(steps=3)
        assert info.value.step == 2 and [(r.worker, r.tensor) for r in info.value.reports] == [(1, POISONED)]
        assert trainer.step == 2 and len(trainer.history) == 2
        assert_states_equal(before, worker_states(trainer))  # parameters, optimizer, residuals: as before
        history = trainer.fit(steps=2)  # the trainer goes on, from the next batch
        assert [r.step for r in history] == [2, 3] and not any(r.skipped for r in history)
        assert all(np.isfinite(v).all() for v in worker_states(trainer)[0]["model"].values())
        trainer.check_replicas()


def test_nonfinite_skip_skips_the_update_on_every_worker(ray_local):
    with trainer_for("skip", float("nan"), check_every=1) as trainer:
        trainer.fit(steps=2)
        before = worker_states(trainer)
        history = trainer.fit(steps=1)
        (record,) = history
        assert record.step == 2 and record.skipped and record.nonfinite == [f"worker 1, tensor '{POISONED}': 10 NaN, 0 Inf"]
        assert_states_equal(before, worker_states(trainer))  # skipped: nothing moved, on either worker
        history = trainer.fit(steps=2)
        assert [r.skipped for r in history] == [False, False] and trainer.step == 5
        states = worker_states(trainer)
        assert all(np.isfinite(v).all() for v in states[0]["model"].values())
        assert_states_equal([dict(states[0], residuals={})], [dict(states[1], residuals={})])  # replicas identical


def test_nonfinite_propagate_reaches_every_replica_identically(ray_local):
    with trainer_for("propagate", float("inf"), check_every=1) as trainer:
        (record,) = trainer.fit(steps=3)[2:]
        assert record.nonfinite == [f"worker 1, tensor '{POISONED}': 0 NaN, 10 Inf"] and not record.skipped
        states = worker_states(trainer)
        bias = states[0]["model"][POISONED]
        assert not np.isfinite(bias).all() and np.isfinite(states[0]["model"]["1.weight"]).all()
        for k, v in states[0]["model"].items():  # bit-identical, NaN/Inf included
            np.testing.assert_array_equal(v, states[1]["model"][k])
