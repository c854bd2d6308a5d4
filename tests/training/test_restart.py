"""``Trainer.restart`` and ``Trainer.resume``: a new run on a trainer's running actors is, bit for bit, the run a fresh
``casync.Trainer`` with the same arguments makes — parameters, history and checkpoint — across options that change
the plan, the model, the data plane and the workers' settings; a resumed checkpoint goes on as the run that saved it; what cannot be done on the
running actors is refused before anything changes; restarts leak no threads, file descriptors, shared memory or
reserved CPUs."""
from __future__ import annotations

import inspect
import json
import os
import sys
import time

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

CPUS = 0.25
BASE = dict(workers=2, progress=False, timeout_s=60, cpus_per_worker=CPUS)
FIRST = (DigitsMLP((64, 24, 10)), SGD(lr=0.1, momentum=0.9), cross_entropy, DigitsData(batch_size=64))

# the two runs differ from each other and from FIRST (onebit on a ring) in the plan and in what the actors set up
RUNS = {
    # another model (other buckets and layout), DGC on an allgather of top-k, another seed, 2 compute threads
    "dgc": ((DigitsMLP((64, 32, 16, 10)), SGD(lr=0.2), cross_entropy, DigitsData(batch_size=32, seed=3)),
            dict(strategy="allgather", codec="topk:ratio=0.05", momentum_correction=0.9, momentum_masking=True,
                 warmup_steps=3, seed=5, compute_threads=2, check_every=1, bucket_bytes=1 << 10)),
    # a delayed update in flight at the save, full-precision steps, co-located PS, the gloo data plane
    "delayed": ((DigitsMLP((64, 24, 10)), SGD(lr=0.1), cross_entropy, DigitsData(batch_size=64)),
                dict(strategy="ps", codec="onebit", delayed_update=True, full_sync_every=2, transport="gloo")),
}
STEPS, SAVE_AT = 5, 3


@pytest.fixture(scope="module")
def first_run(ray_local, tmp_path_factory):
    """The module's trainer, new, trains the "delayed" run (``fresh``: its history, parameters and checkpoint); the
    tests then restart it with their own arguments."""
    fns, kw = RUNS["delayed"]
    trainer = casync.Trainer(*fns, **BASE, **kw)
    yield trainer, _train(trainer, tmp_path_factory.mktemp("fresh") / "ckpt")
    trainer.close()


@pytest.fixture
def pool(first_run):
    return first_run[0]


def _train(trainer, path):
    """Fit SAVE_AT steps, save to ``path``, fit the rest; the history, the parameters and the checkpoint."""
    head = trainer.fit(steps=SAVE_AT)
    trainer.save(path)
    tail = trainer.fit(steps=STEPS - SAVE_AT)
    params = {k: v.detach().clone() for k, v in trainer.model().state_dict().items()}
    return list(head) + list(tail), params, _checkpoint(path)


def _checkpoint(path):
    meta = json.loads((path / "trainer.json").read_text())
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k].copy() for k in npz.files}
    tensors = {name: torch.load(path / name, weights_only=True) for name in ("model.pt", "optimizer.pt")}
    return meta, arrays, tensors


def _same_record(a, b):
    """Every column of two step records but the measured times (which no two runs share)."""
    timed = {"step_s", "throughput", "compute_s", "sync_s", "exposed_sync_s", "hidden_fraction", "sync_cpu_s"}
    return {k: v for k, v in a.to_dict().items() if k not in timed} == {k: v for k, v in b.to_dict().items()
                                                                        if k not in timed}


def _assert_same_run(got, want):
    (history, params, (meta, arrays, tensors)), (history2, params2, (meta2, arrays2, tensors2)) = got, want
    assert [r.step for r in history] == list(range(STEPS))
    assert all(_same_record(a, b) for a, b in zip(history, history2, strict=True)), (history, history2)
    assert [r.loss for r in history] == [r.loss for r in history2]
    assert params.keys() == params2.keys() and all(torch.equal(params[k], params2[k]) for k in params)
    assert meta == meta2  # step, config, parameter hash, RNG states, data positions, a pending step
    assert arrays.keys() == arrays2.keys() and all(np.array_equal(arrays[k], arrays2[k]) for k in arrays)
    assert any(np.any(v != 0) for v in arrays.values())  # error-feedback residuals were saved
    for name in tensors:
        assert _nested_equal(tensors[name], tensors2[name]), name


def _nested_equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_nested_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_nested_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("name", list(RUNS))
def test_a_restarted_trainer_trains_bit_for_bit_as_a_fresh_one(first_run, name, tmp_path):
    """The "delayed" run, restarted after a run of FIRST, against the module's trainer's own fresh run of it; the
    "dgc" run against a new trainer's."""
    pool, fresh_delayed = first_run
    fns, kw = RUNS[name]
    pool.restart(*FIRST, **BASE, codec="onebit")
    pool.fit(steps=3)  # residuals, momentum, RNG and data position all moved
    pids = ray.get([a.pid.remote() for a in pool._engine.actors.values()])
    assert pool.restart(*fns, **BASE, **kw) is pool
    assert pool.step == 0 and len(pool.history) == 0 and pool.timeline() == []
    assert ray.get([a.pid.remote() for a in pool._engine.actors.values()]) == pids  # no actor was started
    got = _train(pool, tmp_path / "restarted")
    if name == "delayed":
        want = fresh_delayed
    else:
        with casync.Trainer(*fns, **BASE, **kw) as fresh:
            assert fresh.plan.to_dict() == pool.plan.to_dict()
            want = _train(fresh, tmp_path / "fresh")
    _assert_same_run(got, want)
    if name == "delayed":
        assert got[2][0]["arrays"]["pending"]["step"] == SAVE_AT - 1 and any(r.full_precision for r in got[0])
    else:  # the sparsity warm-up ran from step 0 again
        assert got[0][0].density == pytest.approx(0.25) and got[0][-1].density == pytest.approx(0.05)


def test_resume_on_the_running_actors_continues_the_saved_run_bit_for_bit(pool, tmp_path):
    """``resume`` after a restart with other settings: the checkpoint's run comes back on the same actors and goes on
    exactly as the run that saved it did (what ``Trainer.load`` guarantees); a checkpoint the run cannot take is
    refused with the trainer untouched."""
    fns, kw = RUNS["delayed"]
    path = tmp_path / "ckpt"
    pool.restart(*fns, **BASE, **kw)
    pool.fit(steps=SAVE_AT)
    pool.save(path)  # a delayed update in flight
    tail = pool.fit(steps=2)
    want = {k: v.detach().clone() for k, v in pool.model().state_dict().items()}
    pool.restart(*RUNS["dgc"][0], **BASE, **RUNS["dgc"][1])
    pool.fit(steps=1)
    with pytest.raises(ValueError, match="delayed update in flight; load it with delayed_update=True"):
        pool.resume(path, *fns, delayed_update=False)
    with pytest.raises(ValueError, match="different model than model_fn builds"):
        pool.resume(path, DigitsMLP((64, 8, 10)), *fns[1:])
    assert pool.step == 1 and "topk" in str(pool.plan.buckets[0].codec)  # refused: the dgc run goes on
    pool.fit(steps=1)
    assert pool.resume(path, *fns, progress=False) is pool and pool.step == SAVE_AT
    resumed = pool.fit(steps=2)
    got = pool.model().state_dict()
    assert [r.step for r in resumed] == [3, 4] and [r.loss for r in resumed] == [r.loss for r in tail]
    assert all(torch.equal(got[k], want[k]) for k in want)


def _resources(trainer):
    """Per actor: its threads, open file descriptors and mapped shared-memory segments (read from /proc: the actors
    run on this machine), and this machine's casync shared-memory names."""
    pids = ray.get([a.pid.remote() for a in trainer._engine.actors.values()])
    threads = ray.get([a.thread_names.remote() for a in trainer._engine.actors.values()])
    out = []
    for pid, names in zip(pids, threads):
        with open(f"/proc/{pid}/maps") as maps:
            shm = sum("/dev/shm/" in line for line in maps)
        out.append((len(names), len(os.listdir(f"/proc/{pid}/fd")), shm))
    return out, sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"casync{os.getpid()}"))


def test_restarts_leak_no_threads_descriptors_shared_memory_or_cpus(pool):
    fns, kw = RUNS["delayed"]
    pool.restart(*fns, **BASE, **kw)
    pool.fit(steps=2)
    free = ray.available_resources().get("CPU")
    before, names = _resources(pool)
    assert names == []  # every arena name is unlinked once mapped
    for _ in range(2):
        pool.restart(*RUNS["dgc"][0], **BASE, **RUNS["dgc"][1])
        pool.fit(steps=2)
        pool.restart(*fns, **BASE, **kw)
        pool.fit(steps=2)
    after, names = _resources(pool)
    assert after == before and names == []
    assert ray.available_resources().get("CPU") == free  # no reservation beyond the trainer's own


def test_restart_takes_the_constructors_arguments_and_defaults():
    init, restart = inspect.signature(casync.Trainer.__init__), inspect.signature(casync.Trainer.restart)
    explicit = [p for p in restart.parameters.values() if p.kind is not p.VAR_KEYWORD]
    assert [(p.name, p.default) for p in explicit] == [(p.name, p.default) for p in init.parameters.values()
                                                       if p.name in restart.parameters]
    fields = {f.name: f.default for f in casync.training.TrainOptions.__dataclass_fields__.values()}
    keywords = {p.name: p.default for p in init.parameters.values() if p.kind is p.KEYWORD_ONLY}
    assert set(keywords) == set(fields) | {"progress"}  # restart's **options are these TrainOptions fields (and plan options)
    assert all(keywords[k] == fields[k] for k in fields)


def test_what_the_running_actors_cannot_do_is_refused_before_anything_changes(pool):
    fns, kw = FIRST, dict(BASE, codec="onebit")
    pool.restart(*fns, **kw)
    pool.fit(steps=2)
    hashes = pool._engine.call("param_hash")
    refusals = [
        (dict(kw, workers=3), ValueError, r"same actors: this trainer has worker:0, worker:1, the new run needs "
                                          r"worker:0, worker:1, worker:2"),
        (dict(kw, strategy="ps", servers=1), ValueError, "the new run needs worker:0, worker:1, server:0"),
        (dict(kw, cpus_per_worker=0.5), ValueError, "cpus_per_worker=0.5 differs from this trainer's 0.25"),
        (dict(kw, placement="pack"), ValueError, "placement='pack' differs from this trainer's 'spread'"),
        (dict(kw, address="127.0.0.1:1"), ValueError, "already connected to the Ray cluster"),
        (dict(kw, codec="nope"), ValueError, "unknown codec 'nope'"),
        (dict(kw, momentum_masking=True), ValueError, "set momentum_correction too"),
        (dict(kw, bucket_size=3), TypeError, "unexpected keyword"),
    ]
    for args, error, words in refusals:
        with pytest.raises(error, match=words):
            pool.restart(*fns, **args)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        pool.restart(fns[0], fns[1], None, fns[3], **kw)
    assert pool.step == 2 and len(pool.history) == 2 and pool._engine.call("param_hash") == hashes
    assert [r.step for r in pool.fit(steps=1)] == [2]  # the run goes on


def test_a_dead_worker_a_failed_or_closed_trainer_is_refused_with_typed_errors(pool):
    """The module's last test: it kills one of the pool's workers."""
    kw = dict(BASE, codec="onebit")
    victim = pool._engine.actors["worker:1"]
    ray.kill(victim, no_restart=True)
    for _ in range(300):  # until Ray reports it dead
        try:
            ray.get(victim.pid.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.1)
    with pytest.raises(casync.WorkerLostError, match=r"checking the actors before restarting: actor\(s\) \['worker:1'\]"):
        pool.restart(*FIRST, **kw)
    with pytest.raises(casync.SyncError, match="unusable after an earlier failure"):
        pool.restart(*FIRST, **kw)
    pool.close()
    with pytest.raises(casync.SyncError, match="closed"):
        pool.restart(*FIRST, **kw)
