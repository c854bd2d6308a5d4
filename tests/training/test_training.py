"""casync.Trainer: accuracy per codec on digits, bit-identical resume (also after a worker is killed mid-fit),
replica checks, overlap of sync with backward, and that each compression-aware option does what it says.

Starting a Trainer's Ray actors costs 1.5-2.5 CPU-s each (most of these tests' cost), so the tests take their
trainers from the module's pool (``trainers``, ``tests/training/pool.py``): a trainer with the arguments the test
gives, restarted on an earlier test's actors (``Trainer.restart``, bit for bit a fresh trainer).  Runs that can serve
several tests are made once in module-scoped fixtures (``accuracy_runs``, ``resume_runs``).  Tests of what the
constructor refuses, and of failures that leave a trainer unusable, build trainers of their own."""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
ray = pytest.importorskip("ray")

import ray.cloudpickle  # noqa: E402

import casync  # noqa: E402
from casync.datasets.digits import SGD, DigitsData, DigitsMLP, accuracy, cross_entropy, load_split  # noqa: E402
from casync.training.checkpoint import read_checkpoint  # noqa: E402
from casync.sim.costmodel import Profile  # noqa: E402
from casync.training.dgc import MomentumCorrection, warmup_ratio  # noqa: E402
from casync.training.records import History, StepRecord  # noqa: E402
from casync.training.trainer import _covered, lossless_twin  # noqa: E402

pytestmark = pytest.mark.slow

# functions defined here travel to the worker actors by value (this module is not importable there)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SMALL = DigitsMLP((64, 48, 48, 10))
CPUS = 0.25  # a nominal CPU share per worker: several trainers share the module's 4-CPU embedded Ray


def small_args(**kw):
    """The four functions and the options of a 2-worker trainer of the small model."""
    opts = dict(workers=2, codec="onebit", progress=False, timeout_s=60, cpus_per_worker=CPUS)
    opts.update(kw)
    optimizer = opts.pop("optimizer", SGD(lr=0.1))
    data = opts.pop("data", DigitsData(batch_size=128))
    return (opts.pop("model", SMALL), optimizer, cross_entropy, data), opts


def small_trainer(trainers, **kw):
    """That trainer, from the pool: a ``with`` block gives it back."""
    fns, opts = small_args(**kw)
    return trainers.trainer(*fns, **opts)


def params_of(trainer):
    return {k: v.detach().clone() for k, v in trainer.model().state_dict().items()}


def assert_same_params(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"parameter {k} differs"


# -- acceptance: accuracy per codec on a real dataset with a multi-million-parameter model ---------------
ACCURACY_STEPS, ACCURACY_LR = 50, 0.4  # 100 steps at lr 0.2 held the same assertions in twice the time
CODECS = {"none": (None, True), "onebit+ef": ("onebit", True), "topk1%+ef": ("topk:ratio=0.01", True),
          "onebit-no-ef": ("onebit", False)}


@pytest.fixture(scope="module")
def accuracy_runs(trainers):
    """2 workers train casync's 4.3M-parameter mlp on digits for the same number of steps with each codec (4 workers
    took 2.4x as long: each step's Ray round trips, not the model, cost most on 2 cores).  At 50 steps and lr 0.4:
    uncompressed 0.928, onebit+EF 0.930, topk 1 %+EF 0.930, onebit without EF 0.883 (loss of its last 10 steps 1.21
    against 0.29 with EF), so each assertion below holds by 2-3 points and fails with error feedback off."""
    runs = {}
    for label, (codec, ef) in CODECS.items():
        with trainers.trainer(DigitsMLP.named("mlp"), SGD(lr=ACCURACY_LR), cross_entropy, DigitsData(batch_size=32),
                              workers=2, strategy="ring", codec=codec, error_feedback=ef, progress=False,
                              cpus_per_worker=CPUS) as trainer:
            history = trainer.fit(steps=ACCURACY_STEPS)
            runs[label] = (accuracy(trainer.model()), history)
    print({label: round(acc, 4) for label, (acc, _) in runs.items()})
    return runs


def test_model_has_millions_of_parameters():
    assert sum(p.numel() for p in DigitsMLP.named("mlp")().parameters()) > 4_000_000
    assert sum(p.numel() for p in DigitsMLP.named("mlp-deep")().parameters()) > 3_000_000


@pytest.mark.slow
def test_compressed_training_with_error_feedback_matches_uncompressed_accuracy(accuracy_runs):
    baseline = accuracy_runs["none"][0]
    assert baseline > 0.9, f"the uncompressed run itself did not learn digits ({baseline:.3f})"
    for label in ("onebit+ef", "topk1%+ef"):
        acc = accuracy_runs[label][0]
        assert acc >= baseline - 0.02, f"{label}: accuracy {acc:.4f} vs {baseline:.4f} uncompressed"
    # the wire really carried compressed payloads
    assert accuracy_runs["onebit+ef"][1][-1].compression_ratio > 25
    assert accuracy_runs["topk1%+ef"][1][-1].compression_ratio > 25
    assert accuracy_runs["none"][1][-1].compression_ratio == pytest.approx(1.0)


@pytest.mark.slow
def test_onebit_without_error_feedback_is_visibly_worse(accuracy_runs):
    with_ef, without = accuracy_runs["onebit+ef"], accuracy_runs["onebit-no-ef"]
    assert without[0] < with_ef[0] - 0.02
    assert without[1].mean("loss", ACCURACY_STEPS - 10) > 2 * with_ef[1].mean("loss", ACCURACY_STEPS - 10)


# -- a trainer for the behaviour of fit, records, replicas and overlap -------------------------------------
@pytest.fixture
def deep(trainers):
    """2 workers; heavy middle layer, light last layers (their own bucket), so backward continues after the
    last layers' gradients are ready."""
    model = DigitsMLP((64, 1024, 1024, 16, 10))
    with trainers.trainer(model, SGD(lr=0.1), cross_entropy, DigitsData(batch_size=64), workers=2, codec="onebit",
                          bucket_bytes=64 << 10, progress=False, check_every=2, timeout_s=60,
                          cpus_per_worker=CPUS) as trainer:
        yield trainer


def test_late_layer_sync_starts_before_backward_ends(deep):
    assert deep.plan.buckets[0].tensor_names[-1] == "5.weight" and len(deep.plan.buckets) == 3
    deep.fit(steps=4)
    early = []
    for step in range(deep.step - 4, deep.step):
        rows = deep.timeline(step)
        for w in ("worker:0", "worker:1"):
            (backward,) = [r for r in rows if r["actor"] == w and r["op"] == "backward"]
            first_sync = min(r["start"] for r in rows if r["actor"] == w and r["bucket"] == deep.plan.buckets[0].name
                             and r["op"] in ("encode", "decode", "merge"))
            early.append(first_sync < backward["end"])
    assert any(early), "no sync op of the last layers started before its step's backward pass ended"


def test_fit_records_and_exports(deep, tmp_path):
    start = deep.step
    history = deep.fit(steps=3)
    assert [r.step for r in history] == [start, start + 1, start + 2]
    assert deep.history[-3:] == list(history)
    for r in history:
        assert np.isfinite(r.loss) and r.samples == 2 * 64
        assert r.sync_s > 0 and 0 <= r.exposed_sync_s <= r.sync_s + 1e-9 and 0 <= r.hidden_fraction <= 1
        ops = [row for row in deep.timeline(r.step) if row["actor"].startswith("worker:") and row["cpu"] is not None]
        assert 0 < r.sync_cpu_s == pytest.approx(sum(row["cpu"] for row in ops) / 2)  # the 2 workers' mean
        assert r.sync_cpu_s <= sum(row["end"] - row["start"] for row in ops) / 2 + 1e-3  # thread time <= wall
        assert r.bytes_sent > 0 and r.compression_ratio == pytest.approx(r.raw_bytes / r.bytes_sent)
        assert r.compression_ratio > 20  # onebit
        assert r.throughput == pytest.approx(r.samples / r.step_s)
    assert [r.replicas_checked for r in history] == [(s + 1) % 2 == 0 for s in range(start, start + 3)]
    csv_text = history.to_csv(tmp_path / "h.csv").read_text().splitlines()
    assert csv_text[0].split(",")[:3] == ["step", "loss", "samples"] and len(csv_text) == 4
    assert History.from_json(history.to_json(tmp_path / "h.json")) == history
    assert deep.draw_timeline(str(tmp_path / "t.png"), step=start)
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_replicas_bit_identical_and_model_is_worker_zero(deep):
    deep.fit(steps=2)
    states = deep._engine.call("model_state")
    for name, value in states[0].items():
        np.testing.assert_array_equal(states[1][name], value, err_msg=name)
    model = deep.model()
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), states[0][name])
    assert deep.check_replicas() == deep._engine.call("param_hash")[1]


def test_fit_epochs_runs_one_pass_over_the_shortest_shard(deep):
    per_worker = (len(load_split()[1]) + 1) // 2 // 64  # drop_last
    assert len(deep.fit(epochs=1)) == per_worker
    with pytest.raises(ValueError, match="exactly one"):
        deep.fit(steps=1, epochs=1)
    with pytest.raises(ValueError, match="non-negative"):
        deep.fit(steps=-1)


# -- replica mismatch is an error ------------------------------------------------------------------------
def _pid_dependent_model():
    model = torch.nn.Linear(64, 10)
    with torch.no_grad():
        model.bias.add_(os.getpid() % 997)  # not a function of the seed: replicas start different
    return model


class _ManualOffset(torch.nn.Module):
    """A frozen parameter that the loss function updates from the local batch: it is never synchronized."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)
        self.offset = torch.nn.Parameter(torch.zeros(10), requires_grad=False)

    def forward(self, x):
        return self.fc(x) + self.offset


def _drifting_loss(model, batch):
    x, y = batch
    with torch.no_grad():
        model.offset.add_(x.mean())
    return torch.nn.functional.cross_entropy(model(x), y)


def test_replicas_that_start_different_raise(ray_local):
    fns, opts = small_args(model=_pid_dependent_model)
    with pytest.raises(casync.ReplicaMismatchError, match=r"at start.*worker:"):
        casync.Trainer(*fns, **opts)


def test_replicas_that_drift_raise_at_the_next_check(ray_local):
    trainer = casync.Trainer(_ManualOffset, SGD(lr=0.1), _drifting_loss, DigitsData(batch_size=64), workers=2,
                             codec="onebit", check_every=2, progress=False, timeout_s=60, cpus_per_worker=CPUS)
    try:
        trainer.fit(steps=1)  # not a check step
        with pytest.raises(casync.ReplicaMismatchError, match=r"after step 1: worker\(s\) \['worker:\d'\]"):
            trainer.fit(steps=1)
        with pytest.raises(casync.SyncError, match="unusable"):
            trainer.fit(steps=1)
    finally:
        trainer.close()


# -- checkpoint and resume -------------------------------------------------------------------------------
RESUME_MODES = {
    # error feedback residuals and optimizer momentum; the data epoch ends between save and the end
    "onebit-ef": dict(codec="onebit", optimizer=SGD(lr=0.1, momentum=0.9)),
    # DGC: per-worker momentum buffers, masking, sparsity warm-up across the save; planned by strategy="auto" for
    # a cluster and profile that Trainer.load is not given (the planner picks allgather, one partition, as
    # _plan_bucket builds it; test_a_planned_trainer_...)
    "dgc": dict(codec="topk:ratio=0.05", strategy="auto", momentum_correction=0.9, momentum_masking=True,
                warmup_steps=5, optimizer=SGD(lr=0.1, momentum=0.0),
                cluster=casync.ClusterModel(nodes=2, workers_per_node=1, bandwidth_gbps=1.0),
                profile=Profile.default()),
    # a delayed update in flight at the save, full-precision steps, PS server residuals; 3 buckets (whose ops can
    # be ready at once), and the resumed run has 2 compute threads per actor (test_compute_threads_...)
    "delayed": dict(codec="onebit", strategy="ps", servers=1, delayed_update=True, full_sync_every=2,
                    optimizer=SGD(lr=0.1), bucket_bytes=1 << 10),
}
LOAD_OVERRIDES = {"delayed": dict(compute_threads=2)}  # Trainer.load's overrides, per mode
PLANNED_MODE = "dgc"  # the mode whose plan the planner chose
KILLED_MODE = "onebit-ef"  # the mode whose first trainer then loses a worker mid-fit (test_killed_worker_...)
N_STEPS, M_STEPS = 3, 4  # 5 batches per epoch and worker: the resumed part crosses an epoch boundary
FAULT_TIMEOUT_S = 60  # small_trainer's timeout_s


@pytest.fixture(scope="module")
def resume_runs(trainers, tmp_path_factory):
    """``run(mode)``: each mode's save-and-resume run, made once per module on first use, so that a test of
    what only one mode does is generated for that mode alone."""
    done: dict[str, dict] = {}

    def run(mode: str) -> dict:
        if mode not in done:
            done[mode] = _resume_run(mode, trainers, tmp_path_factory)
        return done[mode]

    return run


@pytest.fixture(params=list(RESUME_MODES))
def resumed(request, resume_runs):
    return resume_runs(request.param)


def _compute_threads(trainer):
    """Each actor's set of its executors' compute threads."""
    actors = trainer._engine.actors
    seen = ray.get([a.__ray_call__.remote(lambda self: {e.compute_threads for e in self._executors.values()})
                    for a in actors.values()])
    return dict(zip(actors, seen))


def _kill_a_worker_mid_fit(trainer):
    """Fit on in a thread and ``ray.kill`` worker 1 once the trainer is 3 steps further; what ``fit`` raised."""
    caught, target = [], trainer.step + 3

    def fit_on():
        try:
            trainer.fit(steps=10_000)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            caught.append((exc, time.monotonic()))

    thread = threading.Thread(target=fit_on, daemon=True)
    thread.start()
    while trainer.step < target and thread.is_alive():
        time.sleep(0.01)
    killed_at = time.monotonic()
    ray.kill(trainer._engine.actors["worker:1"], no_restart=True)
    thread.join(FAULT_TIMEOUT_S + 30)
    return dict(caught=caught, killed_at=killed_at, alive=thread.is_alive())


def _resume_run(mode, trainers, tmp_path_factory):
    """Train N steps, save, train M more (saving changes nothing: the uninterrupted run); in KILLED_MODE, fit on
    and kill a worker (the pool then closes that trainer).  Then load the checkpoint into the pool's other actors
    (``Trainer.resume``, or ``Trainer.load`` on new ones) and train M steps there."""
    kw = dict(RESUME_MODES[mode])
    path = tmp_path_factory.mktemp(mode) / "ckpt"
    optimizer = kw["optimizer"]
    killed = None
    with small_trainer(trainers, **kw) as first:
        head = first.fit(steps=N_STEPS)
        first.save(path)
        tail = first.fit(steps=M_STEPS)
        expected = params_of(first)
        states = first._engine.call("export_state", False)
        threads = {"first": _compute_threads(first)}
        buckets = len(first.plan.buckets)
        plans = {"first": first.plan.to_dict()["buckets"]}
        if mode == KILLED_MODE:
            killed = _kill_a_worker_mid_fit(first)
    with trainers.loaded(path, SMALL, optimizer, cross_entropy, DigitsData(batch_size=128),
                         progress=False, **LOAD_OVERRIDES.get(mode, {})) as second:  # cpus from the checkpoint
        loaded_step = second.step
        resumed_tail = second.fit(steps=M_STEPS)
        got = params_of(second)
        threads["resumed"] = _compute_threads(second)
        plans["resumed"] = second.plan.to_dict()["buckets"]
    single = None
    if kw.get("delayed_update"):  # the one mode where fit() boundaries could matter: one fit(N+M) call
        with small_trainer(trainers, **kw) as uninterrupted:
            uninterrupted.fit(steps=N_STEPS + M_STEPS)
            single = params_of(uninterrupted)
    return dict(mode=mode, head=head, tail=tail, resumed_tail=resumed_tail, expected=expected, got=got,
                states=states, path=path, single=single, loaded_step=loaded_step, threads=threads, buckets=buckets,
                killed=killed, plans=plans)


def test_resume_equals_uninterrupted_run(resumed):
    assert resumed["loaded_step"] == N_STEPS
    assert_same_params(resumed["expected"], resumed["got"])
    if resumed["single"] is not None:
        assert_same_params(resumed["single"], resumed["got"])
    assert [r.loss for r in resumed["resumed_tail"]] == [r.loss for r in resumed["tail"]]
    assert [r.step for r in resumed["resumed_tail"]] == list(range(N_STEPS, N_STEPS + M_STEPS))
    ck = read_checkpoint(resumed["path"])
    assert ck.step == N_STEPS and ck.residuals and any(np.any(r != 0) for r in ck.residuals.values())
    assert (ck.pending_step is not None) == (resumed["mode"] == "delayed")


def test_checkpoint_holds_no_pickles(resumed):
    meta = json.loads((resumed["path"] / "trainer.json").read_text())
    assert meta["step"] == N_STEPS and len(meta["workers"]) == 2
    with np.load(resumed["path"] / "arrays.npz", allow_pickle=False) as npz:
        assert all(npz[k].dtype != object for k in npz.files)
    torch.load(resumed["path"] / "model.pt", weights_only=True)
    torch.load(resumed["path"] / "optimizer.pt", weights_only=True)


# -- a worker killed mid-fit (KILLED_MODE's first trainer, after its uninterrupted run), then the resume -----
def test_killed_worker_surfaces_as_worker_lost_in_bounded_time(resume_runs):
    killed = resume_runs(KILLED_MODE)["killed"]
    assert not killed["alive"] and len(killed["caught"]) == 1
    exc, at = killed["caught"][0]
    assert isinstance(exc, casync.WorkerLostError), repr(exc)
    assert "worker:1" in str(exc)
    assert at - killed["killed_at"] < FAULT_TIMEOUT_S + 10


def test_resume_after_the_fault_is_bit_identical_to_the_uninterrupted_run(resume_runs):
    """The checkpoint is loaded into other actors after the first trainer lost worker 1 (and was closed)."""
    run = resume_runs(KILLED_MODE)
    assert run["killed"]["caught"] and run["loaded_step"] == N_STEPS
    assert run["got"].keys() == run["expected"].keys()
    for k in run["got"]:
        assert torch.equal(run["got"][k], run["expected"][k]), k


def test_checkpoint_missing_corrupted_or_of_another_model(resume_runs, tmp_path):
    path = resume_runs(KILLED_MODE)["path"]
    fns = (SMALL, SGD(lr=0.1, momentum=0.9), cross_entropy, DigitsData(batch_size=128))
    with pytest.raises(FileNotFoundError, match="not a Trainer checkpoint"):
        casync.Trainer.load(tmp_path / "missing", *fns)
    with pytest.raises(ValueError, match=r"different model than model_fn builds.*'1.weight', \(48, 64\)"):
        casync.Trainer.load(path, DigitsMLP((64, 32, 10)), *fns[1:])
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    (broken / "arrays.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="corrupted Trainer checkpoint"):
        casync.Trainer.load(broken, *fns)
    shutil.copytree(path, broken, dirs_exist_ok=True)
    (broken / "model.pt").write_bytes((broken / "model.pt").read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupted Trainer checkpoint"):
        casync.Trainer.load(broken, *fns)
    shutil.copytree(path, broken, dirs_exist_ok=True)
    meta = json.loads((broken / "trainer.json").read_text())
    del meta["arrays"]
    (broken / "trainer.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="corrupted Trainer checkpoint.*KeyError"):
        casync.Trainer.load(broken, *fns)


def test_sparsity_warmup_thins_the_wire_geometrically(resume_runs):  # what only the dgc mode does
    resumed = resume_runs("dgc")
    history = list(resumed["head"]) + list(resumed["tail"])
    expected = [warmup_ratio(t, 0.05, 0.25, 5) for t in range(N_STEPS + M_STEPS)]
    assert [r.density for r in history] == pytest.approx(expected)
    sent = [r.bytes_sent for r in history]
    assert all(a > b for a, b in zip(sent[:5], sent[1:6])), sent
    assert sent[5] == sent[6]


def test_momentum_masking_forgets_sent_coordinates(resume_runs):  # what only the dgc mode does
    resumed = resume_runs("dgc")
    for state in resumed["states"]:
        worker = f"worker:{state['rank']}"
        residual = {k.split("/")[1]: v for k, v in state["residuals"].items() if k.startswith(worker + "/")}
        sent_any, kept_any = False, False
        for bucket, flat in residual.items():  # allgather: one partition per bucket
            members = [(m.spec.name, m.offset, m.stop) for m in _plan_bucket(bucket).members]
            for name, start, stop in members:
                u = state["momentum"][name].reshape(-1)
                sent = flat[start:stop] == 0
                assert np.all(u[sent] == 0), f"{worker} {name}: momentum kept at sent coordinates"
                sent_any |= bool(sent.any())
                kept_any |= bool(np.any(u[~sent] != 0))
        assert sent_any and kept_any


def _plan_bucket(name):
    model = SMALL()
    return casync.build_plan(model, workers=2, strategy="allgather", codec="topk:ratio=0.05",
                             bucket_bytes=casync.training.options.TRAIN_BUCKET_BYTES).bucket(name)


def test_full_precision_steps_carry_float32(resume_runs):  # what only the delayed mode does
    resumed = resume_runs("delayed")
    history = list(resumed["head"]) + list(resumed["tail"])
    assert [r.full_precision for r in history] == [(t + 1) % 2 == 0 for t in range(N_STEPS + M_STEPS)]
    for r in history:
        assert r.compression_ratio == pytest.approx(1.0) if r.full_precision else r.compression_ratio > 20


# -- what the compression-aware options do ---------------------------------------------------------------
def test_momentum_correction_without_compression_is_momentum_sgd(trainers):
    """Momentum moved before the (linear, lossless) sync gives momentum SGD on the averaged gradient."""
    lr, steps, workers = 0.1, 5, 2
    data = DigitsData(batch_size=64, shuffle=False)
    with small_trainer(trainers, codec=None, optimizer=SGD(lr=lr, momentum=0.0), momentum_correction=0.9,
                       data=data) as trainer:
        trainer.fit(steps=steps)
        got = params_of(trainer)
    model = SMALL_INIT_MODEL()
    optimizer = SGD(lr=lr, momentum=0.9)(model.parameters())
    batches = [list(data(r, workers))[:steps] for r in range(workers)]
    for t in range(steps):
        grads = []
        for r in range(workers):
            model.zero_grad()
            cross_entropy(model, batches[r][t]).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        for n, p in model.named_parameters():
            p.grad = (grads[0][n] + grads[1][n]) / workers
        optimizer.step()
    expected = model.state_dict()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
    assert max(float((expected[n] - SMALL_INIT()[n]).abs().max()) for n in expected) > 1e-3  # it moved


def SMALL_INIT():
    torch.manual_seed(0)
    return SMALL().state_dict()


def test_delayed_update_applies_step_t_while_step_t_plus_1_computes(trainers):
    """Reference in-process: step t's gradient is taken on parameters that lack step t-1's update."""
    lr, steps, workers = 0.5, 4, 2
    data = DigitsData(batch_size=64, shuffle=False)
    with small_trainer(trainers, codec=None, optimizer=SGD(lr=lr), data=data, delayed_update=True) as trainer:
        trainer.fit(steps=steps)
        got = params_of(trainer)

    def reference(delayed):
        model = SMALL_INIT_MODEL()
        base = {k: v.clone() for k, v in model.state_dict().items()}
        batches = [list(data(r, workers))[:steps] for r in range(workers)]
        grads = []
        for t in range(steps):
            applied = grads[:t - 1] if delayed else grads[:t]
            model.load_state_dict({k: base[k] - lr * sum((g[k] for g in applied), torch.zeros_like(base[k]))
                                   for k in base})
            per_worker = []
            for r in range(workers):
                model.zero_grad()
                cross_entropy(model, batches[r][t]).backward()
                per_worker.append({k: p.grad.clone() for k, p in model.named_parameters()})
            grads.append({k: sum(g[k] for g in per_worker) / workers for k in base})
        return {k: base[k] - lr * sum(g[k] for g in grads) for k in base}

    delayed, standard = reference(True), reference(False)
    for name in got:
        torch.testing.assert_close(got[name], delayed[name], rtol=1e-5, atol=1e-6)
    assert max(float((delayed[n] - standard[n]).abs().max()) for n in got) > 1e-4


def SMALL_INIT_MODEL():
    torch.manual_seed(0)
    return SMALL()


# -- errors ------------------------------------------------------------------------------------------------
def test_compute_threads_reach_every_executor_and_change_no_bit(resume_runs):
    """Two sync ops at once per actor, on the workers and on a PS server, change when ops run, not the parameters:
    the delayed mode's checkpoint, resumed with compute_threads=2, trains its M steps to the very parameters that
    the saved trainer (1 thread) reached (``resume_runs`` makes both runs: this test starts no actors)."""
    run = resume_runs("delayed")
    assert run["buckets"] >= 3  # ops of several buckets can be ready at once
    for label, threads in (("first", 1), ("resumed", 2)):
        seen = run["threads"][label]
        assert list(seen.values()) == [{threads}] * len(seen) and "server:0" in seen, (label, seen)
    assert_same_params(run["expected"], run["got"])


def test_bad_functions_and_option_conflicts_raise_before_starting_workers():
    with pytest.raises(TypeError, match="model_fn must return a torch.nn.Module"):
        casync.Trainer(lambda: "model", SGD(), cross_entropy, DigitsData(), workers=2)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        casync.Trainer(SMALL, SGD(), None, DigitsData(), workers=2)
    with pytest.raises(ValueError, match="momentum of its own"):
        casync.Trainer(SMALL, SGD(momentum=0.9), cross_entropy, DigitsData(), workers=2, momentum_correction=0.9)
    with pytest.raises(ValueError, match="sparse codecs"):
        casync.Trainer(SMALL, SGD(), cross_entropy, DigitsData(), workers=2, codec="onebit",
                       momentum_correction=0.9, momentum_masking=True)
    with pytest.raises(ValueError, match="sparse codec with a ratio"):
        casync.Trainer(SMALL, SGD(), cross_entropy, DigitsData(), workers=2, codec="onebit", warmup_steps=3)
    with pytest.raises(ValueError, match="one or the other"):
        casync.Trainer(SMALL, SGD(), cross_entropy, DigitsData(), workers=2, codec="topk", momentum_correction=0.9,
                       momentum_masking=True, delayed_update=True)
    with pytest.raises(ValueError, match="check_every"):
        casync.Trainer(SMALL, SGD(), cross_entropy, DigitsData(), workers=2, check_every=0)
    with pytest.raises(ValueError, match="compute_threads"):
        casync.Trainer(SMALL, SGD(), cross_entropy, DigitsData(), workers=2, compute_threads=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        casync.Trainer(SMALL, SGD(), cross_entropy, DigitsData(), workers=2, bucket_size=3)


def _vector_loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


def test_user_error_in_a_worker_surfaces_as_itself_and_the_trainer_stops(trainers):
    """On the pool's idle trainer, which the pool then closes (the module's last test that takes one from it)."""
    with trainers.trainer(SMALL, SGD(), _vector_loss, DigitsData(batch_size=64), workers=2, progress=False,
                          timeout_s=60, cpus_per_worker=CPUS) as trainer:
        with pytest.raises(TypeError, match=r"worker \d, step 0: loss_fn must return a scalar"):
            trainer.fit(steps=1)
        with pytest.raises(casync.SyncError, match="unusable"):
            trainer.fit(steps=1)


def test_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Trainer checkpoint"):
        read_checkpoint(tmp_path)
    (tmp_path / "trainer.json").write_text(json.dumps({"format": "casync.Trainer checkpoint", "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        read_checkpoint(tmp_path)


# -- pure pieces ---------------------------------------------------------------------------------------------
def test_warmup_schedule_and_momentum_correction_units():
    assert warmup_ratio(0, 0.01, 0.25, 4) == 0.25
    assert warmup_ratio(2, 0.01, 0.25, 4) == pytest.approx(0.05)  # geometric midpoint
    assert warmup_ratio(4, 0.01, 0.25, 4) == 0.01 and warmup_ratio(9, 0.01, 0.25, 0) == 0.01
    mc = MomentumCorrection(0.5, {"w": torch.zeros(4)})
    mc.correct("w", torch.ones(4))
    u = mc.correct("w", torch.ones(4))
    assert u.tolist() == [1.5] * 4
    mc.mask("w", np.array([True, False, True, False]))
    assert mc.buffers["w"].tolist() == [0.0, 1.5, 0.0, 1.5]
    assert mc.correct("w", None).tolist() == [0.0, 0.75, 0.0, 0.75]


def test_covered_and_lossless_twin():
    assert _covered(0.0, 10.0, [(2.0, 4.0), (3.0, 6.0), (8.0, 20.0)]) == pytest.approx(6.0)
    assert _covered(0.0, 1.0, []) == 0.0
    plan = casync.build_plan("mlp", workers=3, strategy="ps", codec="onebit", servers=2, bucket_bytes=1 << 20)
    twin = lossless_twin(plan)
    assert set(twin.graph.nodes) == set(plan.graph.nodes)
    assert {str(b.codec) for b in twin.buckets} == {"none"}
    assert twin.wire_bytes() > 20 * plan.wire_bytes()


def test_history_columns():
    h = History([StepRecord(step=i, loss=float(i), samples=2, step_s=1.0, throughput=2.0, compute_s=0.5,
                            sync_s=0.2, exposed_sync_s=0.1, hidden_fraction=0.5, bytes_sent=10, raw_bytes=320,
                            compression_ratio=32.0) for i in range(4)])
    assert h.column("loss") == [0.0, 1.0, 2.0, 3.0] and h.mean("loss", skip=2) == 2.5
    with pytest.raises(KeyError, match="no column"):
        h.column("nope")


def test_cli_train_end_to_end(ray_local, tmp_path, capsys):
    from casync.cli import main

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    assert main(["train", "--model", "mlp", "--workers", "2", "--codec", "onebit", "--strategy", "ring", "--steps",
                 "3", "--out", str(out), "--checkpoint", str(ckpt), "--no-progress", "--compute-threads", "2",
                 "--batch-size", "16"]) == 0
    text = capsys.readouterr().out
    assert "trained 3 steps (to step 3) on 2 workers: held-out accuracy" in text and "hidden behind backward" in text
    assert "of CPU per worker and step" in text
    assert len(History.from_json(out / "history.json")) == 3 and (out / "history.csv").is_file()
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert read_checkpoint(ckpt).step == 3
    assert read_checkpoint(ckpt).config["options"]["compute_threads"] == 2
    again = tmp_path / "again"  # a resumed run keeps the checkpoint's settings, but threads change no result
    assert main(["train", "--resume", str(ckpt), "--steps", "1", "--checkpoint", str(again), "--no-progress",
                 "--compute-threads", "1", "--out", str(tmp_path / "again_out")]) == 0
    assert read_checkpoint(again).step == 4 and read_checkpoint(again).config["options"]["compute_threads"] == 1
    # the resumed run's batches are the checkpoint's (16 per worker), not the flag's default (32)
    assert History.from_json(tmp_path / "again_out" / "history.json").column("samples") == [32]
    capsys.readouterr()
    assert main(["train", "--resume", str(ckpt), "--steps", "1", "--batch-size", "8", "--no-progress"]) == 2
    assert "--batch-size 8: the checkpoint" in capsys.readouterr().err
    assert main(["train", "--model", "nope", "--steps", "1"]) == 2
    assert "unknown digits model 'nope'" in capsys.readouterr().err
    assert main(["train", "--steps", "1", "--compute-threads", "0", "--no-progress"]) == 2
    assert "compute_threads must be >= 1" in capsys.readouterr().err


def _one_shot_data(rank, world_size):
    x, y = load_split()[:2]
    return ((x[i:i + 64], y[i:i + 64]) for i in range(rank * 64, 4 * 64, world_size * 64))  # a generator: 2 batches


def test_data_that_cannot_be_iterated_twice_is_reported(ray_local):
    trainer = casync.Trainer(SMALL, SGD(), cross_entropy, _one_shot_data, workers=2, progress=False, timeout_s=60,
                             cpus_per_worker=CPUS)
    try:
        trainer.fit(steps=2)
        with pytest.raises(ValueError, match=r"worker \d: data_fn's iterable is exhausted after one epoch"):
            trainer.fit(steps=1)
    finally:
        trainer.close()


def test_a_planned_trainer_resumes_with_the_cluster_and_profile_it_was_planned_for(resume_runs):
    """strategy="auto" with cluster= and profile= (PLANNED_MODE's runs): the checkpoint holds both, and Trainer.load
    rebuilds the same plan without them (it re-planned for the default cluster and failed on a residual the other
    plan lacks)."""
    run = resume_runs(PLANNED_MODE)
    assert RESUME_MODES[PLANNED_MODE]["strategy"] == "auto"
    assert {"cluster", "profile"} <= set(read_checkpoint(run["path"]).config["plan_options"])
    assert run["plans"]["resumed"] == run["plans"]["first"]  # the planner's choices, not its timings
    assert_same_params(run["expected"], run["got"])


def test_plan_options_round_trip_through_a_checkpoint_config():
    from casync.sim.costmodel import Profile
    from casync.training.config import options_from_json, options_to_json

    cluster, profile = casync.ClusterModel(nodes=2, workers_per_node=2, host_cores=2), Profile.default()
    kept, dropped = options_to_json({"cluster": cluster, "profile": profile, "ready_times": {"w": 0.5},
                                     "odd": object()})
    assert dropped == ["odd"]
    back = options_from_json(json.loads(json.dumps(kept)), "ckpt")
    assert back["cluster"] == cluster and back["ready_times"] == {"w": 0.5}
    assert back["profile"].to_dict() == profile.to_dict()
    with pytest.raises(ValueError, match="unknown saved type 'Blob'"):
        options_from_json({"x": {"__casync_type__": "Blob", "value": {}}}, "ckpt")
