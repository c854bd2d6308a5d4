"""casync.Trainer when things go wrong: NaN/Inf in one worker's gradient under each ``nonfinite`` mode (also
with a delayed update across a checkpoint) and bad input to the Trainer.  A worker killed mid-fit, the
bit-identical resume after it and broken checkpoints are tested in test_training.py, on the run that its
resume tests make anyway (a Trainer of its own here cost 2 more trainers' actor starts).  The tests whose trainers
can train on afterwards share their actors through the module's pool (``tests/training/pool.py``)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
ray = pytest.importorskip("ray")

import ray.cloudpickle  # noqa: E402

import casync  # noqa: E402
from casync.datasets.digits import SGD, DigitsData, DigitsMLP, cross_entropy  # noqa: E402

pytestmark = pytest.mark.slow

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


def trainer_for(trainers, mode, value, **kw):
    """A trainer from the module's pool (``tests/training/pool.py``): a ``with`` block gives it back."""
    return trainers.trainer(SMALL, SGD(lr=0.1, momentum=0.9), poisoned_loss, PoisonedDigits(1, 2, value), workers=2,
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
def test_nonfinite_raise_names_step_worker_parameter_and_changes_nothing(trainers):
    with trainer_for(trainers, "raise", float("inf")) as trainer:
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


def test_nonfinite_skip_skips_the_update_on_every_worker(trainers):
    with trainer_for(trainers, "skip", float("nan"), check_every=1) as trainer:
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


def test_nonfinite_propagate_reaches_every_replica_identically(trainers):
    with trainer_for(trainers, "propagate", float("inf"), check_every=1) as trainer:
        (record,) = trainer.fit(steps=3)[2:]
        assert record.nonfinite == [f"worker 1, tensor '{POISONED}': 0 NaN, 10 Inf"] and not record.skipped
        states = worker_states(trainer)
        bias = states[0]["model"][POISONED]
        assert not np.isfinite(bias).all() and np.isfinite(states[0]["model"]["1.weight"]).all()
        for k, v in states[0]["model"].items():  # bit-identical, NaN/Inf included
            np.testing.assert_array_equal(v, states[1]["model"][k])


# -- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("slot", range(4))
def test_functions_that_are_not_callable(slot):
    fns = [SMALL, SGD(), cross_entropy, DigitsData()]
    label = ("model_fn", "optimizer_fn", "loss_fn", "data_fn")[slot]
    fns[slot] = {"model": 3}
    with pytest.raises(TypeError, match=f"{label} must be callable, got dict"):
        casync.Trainer(*fns, workers=2, progress=False)


@pytest.mark.parametrize("kw, error, words", [
    (dict(workers=0), ValueError, "workers must be >= 1, got 0"),
    (dict(workers=-1), ValueError, "workers must be >= 1, got -1"),
    (dict(workers=2, codec="nope"), ValueError, "unknown codec 'nope'"),
    (dict(workers=2, strategy="nope"), ValueError, "unknown strategy 'nope'"),
    (dict(workers=2, nonfinite="ignore"), ValueError, "nonfinite must be one of"),
])
def test_bad_plan_options_raise_before_any_worker_starts(kw, error, words):
    with pytest.raises(error, match=words):
        casync.Trainer(SMALL, SGD(), cross_entropy, DigitsData(), progress=False, **kw)


def test_optimizer_fn_that_returns_no_optimizer():
    with pytest.raises(TypeError, match="optimizer_fn must return a torch.optim.Optimizer, got str"):
        casync.Trainer(SMALL, lambda params: "sgd", cross_entropy, DigitsData(), workers=2, progress=False)


def _empty_data(rank, world_size):
    return []


def test_data_fn_with_no_batches_fails_at_start(ray_local):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"worker \d: data_fn\(\d, 2\) returned an empty shard"):
        casync.Trainer(SMALL, SGD(), cross_entropy, _empty_data, workers=2, progress=False, timeout_s=60,
                       cpus_per_worker=CPUS)
    assert time.monotonic() - t0 < 60 + 30


def _failing_loss(model, batch):
    raise KeyError("no such column in batch")


def test_loss_fn_that_raises_surfaces_as_itself_with_worker_and_step(ray_local):
    with casync.Trainer(SMALL, SGD(), _failing_loss, DigitsData(batch_size=64), workers=2, progress=False,
                        timeout_s=60, cpus_per_worker=CPUS) as trainer:
        with pytest.raises(KeyError, match=r"no such column(.|\n)*casync.Trainer worker \d, step 0"):
            trainer.fit(steps=1)
        with pytest.raises(casync.SyncError, match="unusable"):
            trainer.fit(steps=1)


def params_of(trainer):
    return {k: v.detach().clone() for k, v in trainer.model().state_dict().items()}


# -- NaN/Inf with delayed_update: the pending step across a checkpoint, and DGC momentum ----------------------
def delayed_trainer(trainers, mode, **kw):
    return trainers.trainer(SMALL, SGD(lr=0.1), poisoned_loss, PoisonedDigits(1, 2, float("nan")), workers=2,
                            codec="onebit", nonfinite=mode, progress=False, timeout_s=60, cpus_per_worker=CPUS,
                            delayed_update=True, **kw)


def test_delayed_skip_with_momentum_correction_voids_cleanly_across_a_checkpoint(trainers, tmp_path):
    """Step 2 (worker 1's NaN) is in flight when the checkpoint is taken: the resumed trainer must still skip
    it (its NaN/Inf reports travel with the checkpoint), and the NaN must not stay in worker 1's DGC momentum
    (which would void every later step)."""
    path = tmp_path / "ckpt"
    with delayed_trainer(trainers, "skip", momentum_correction=0.9) as first:
        head = first.fit(steps=3)  # step 2's update is in flight
        assert [(r.step, r.skipped) for r in head] == [(0, False), (1, False), (2, True)]
        assert all(torch.isfinite(v).all() for v in first.model().state_dict().values())  # it will be skipped
        first.save(path)
        tail = first.fit(steps=3)
        # step 3 started from step 2's momentum, so it is voided too; then training goes on
        assert [(r.step, r.skipped) for r in tail] == [(3, True), (4, False), (5, False)]
        assert all(np.isfinite(v).all() for m in first._engine.call("momentum_buffers") for v in m.values())
        expected = params_of(first)
    assert all(torch.isfinite(v).all() for v in expected.values())
    with trainers.loaded(path, SMALL, SGD(lr=0.1), poisoned_loss, PoisonedDigits(1, 2, float("nan")),
                         progress=False) as second:
        resumed = second.fit(steps=3)
        got = params_of(second)
    assert [(r.step, r.skipped, r.loss) for r in resumed] == [(r.step, r.skipped, r.loss) for r in tail]
    for k in expected:
        assert torch.equal(expected[k], got[k]), k


def test_delayed_raise_still_raises_for_the_pending_step_after_a_resume(trainers, tmp_path):
    path = tmp_path / "ckpt"
    with delayed_trainer(trainers, "raise") as first:
        first.fit(steps=3)
        first.save(path)
    with trainers.loaded(path, SMALL, SGD(lr=0.1), poisoned_loss, PoisonedDigits(1, 2, float("nan")),
                         progress=False) as second:
        with pytest.raises(casync.NonFiniteGradientError, match="step 2: .*worker 1, tensor '3.bias': 10 NaN"):
            second.fit(steps=1)
