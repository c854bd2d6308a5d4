"""The per-rank executor without Ray: every actor of a plan in a thread of this process, over a LocalHub."""
from __future__ import annotations

import gc
import os
import re
import threading
import time
import uuid

import numpy as np
import pytest

import casync
from casync.engines.executor import HEADER_TAG, RankExecutor, body_tag
from casync.engines.memory import WARMUP_SYNCS
from casync.engines.in_place import results_over_gradients
from casync.engines.inputs import flatten_worker_grads
from casync.engines.nonfinite import GradientScan, certifiers, layouts, scan_worker
from casync.errors import SyncError, SyncTimeoutError
from casync.schedule import actor_shares, plan_transfers
from casync.transport.base import LocalChannel, LocalHub
from casync.transport.shm import ShmChannel, arenas
from casync.primitives.codecs.sign import OneBitCodec
from casync.primitives.ir import Actor
from casync.primitives.merge import handed_to_encode
from casync.primitives.residuals import buffers
from tests.helpers import make_grads, same_bits

SHAPES = {"w": (301,), "b": (17, 5), "c": (2,)}


def executors(plan, hub, timeout_s=10.0, compute_threads=1, channel=None, scan=False):
    """An executor per actor of ``plan`` over ``hub`` (or over ``channel(actor)``); ``scan``: the workers' scan
    their gradients for NaN/Inf in their ops (``RankExecutor.scan``)."""
    shares = actor_shares(plan)
    parts = {b.name: list(b.partitions) for b in plan.buckets}
    channel = channel or hub.channel

    def scan_of(actor):
        who = Actor.parse(actor)
        return GradientScan.of(who.index, layouts(plan)) if scan and who.is_worker else None

    return {a: RankExecutor(shares[a], plan.codecs, plan.seed, parts, channel(a), timeout_s,
                            compute_threads=compute_threads, overwritable=results_over_gradients(plan, a),
                            scan=scan_of(a))
            for a in plan.actors}


def run_step(plan, execs, residuals, step, flats, late=(), delay=0.0, out=None, spares=None, here=False, gap=0.0,
             lazy=False):
    """One step on every actor in threads; buckets in ``late`` are provided ``delay`` s after the others, and each
    of the others ``gap`` s after the one before (a slow backward);
    ``out``: per actor, the result buffers to write into (copied away after the step, as callers do);
    ``here``: each worker's results are written over the gradients it provides (``flats``, then overwritten);
    ``lazy``: gradients are provided unscanned (the executors' ops scan them), not with this caller's scan."""
    got, errors = {}, {}
    lay = layouts(plan)

    def go(actor):
        try:
            ex = execs[actor]
            ex.begin(step, residuals[actor], out=None if out is None else out[actor],
                     spares=None if spares is None else spares[actor])
            who = Actor.parse(actor)
            if who.is_worker:
                _, flagged = scan_worker(lay, who.index, flats[who.index])
                early = [b for b in flats[who.index] if b not in late]
                for bucket in early + list(late):
                    mine = None if lazy else {f for f in flagged if f[0] == bucket}
                    if bucket in late and delay:
                        threading.Timer(delay, ex.provide, (bucket, flats[who.index][bucket], mine, here)).start()
                    else:
                        time.sleep(gap)
                        ex.provide(bucket, flats[who.index][bucket], mine, here)
            results, res, _ = ex.finish()
            if here and who.is_worker:
                assert all(results[b] is flats[who.index][b] for b in results)
            if out is not None:
                assert all(results[b] is out[actor][b] for b in results)
                results = {b: r.copy() for b, r in results.items()}
            if spares is not None:  # as the hosts do: what this step replaced is the next step's spares
                spares[actor] = residuals[actor]
            got[actor], residuals[actor] = results, res
        except BaseException as exc:
            errors[actor] = exc

    threads = [threading.Thread(target=go, args=(a,)) for a in plan.actors]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got, errors


@pytest.mark.parametrize("kw", [dict(strategy="ring"), dict(strategy="ps"), dict(strategy="ps", servers=2),
                                dict(strategy="allgather")], ids=["ring", "ps", "ps-servers", "allgather"])
@pytest.mark.parametrize("codec", ["none", "onebit", "topk:ratio=0.2", "randomk:ratio=0.2", "fp16"])
@pytest.mark.parametrize("compute_threads", [1, 3])
def test_threads_over_a_hub_are_bit_identical_to_local_engine(kw, codec, compute_threads):
    check_hub_against_local_engine(casync.build_plan(SHAPES, workers=3, codec=codec, partitions=2, bucket_bytes=600,
                                                     **kw), compute_threads)


def signed_zeros(grads, seed):
    """Gradients with a third of each tensor -0.0 and a third +0.0, as ReLU-masked gradients hold."""
    rng = np.random.default_rng(seed)
    for g in grads:
        for name, x in g.items():
            pick = rng.integers(0, 3, x.shape)
            x[pick == 0], x[pick == 1] = np.float32(-0.0), np.float32(0.0)
    return grads


@pytest.mark.parametrize("kw", [dict(strategy="ring"), dict(strategy="ps"), dict(strategy="ps", two_way=False),
                                dict(strategy="allgather")], ids=["ring", "ps", "ps-oneway", "allgather"])
@pytest.mark.parametrize("codec", ["topk:ratio=0.3", "randomk:ratio=0.3"])
def test_sparse_merges_keep_the_signed_zeros_of_local_engine(kw, codec):
    """The executor adds sparsifiers' entries at their indices (casync.primitives.merge.Sparse); on gradients full
    of -0.0 and +0.0 its results and residuals are still LocalEngine's bit for bit."""
    plan = casync.build_plan(SHAPES, workers=4, codec=codec, partitions=2, bucket_bytes=600, **kw)
    check_hub_against_local_engine(plan, 1, make=lambda step: signed_zeros(make_grads(SHAPES, 4, seed=step), step))


def check_hub_against_local_engine(plan, compute_threads, steps=3, make=None, execs=None):
    """``steps`` syncs over a hub (or ``execs``' channels) against LocalEngine: results and residuals bit for bit."""
    workers = plan.workers
    make = make or (lambda step: make_grads(SHAPES, workers, seed=step))
    reference = casync.LocalEngine(plan)
    execs = execs or executors(plan, LocalHub(timeout_s=10), compute_threads=compute_threads)
    residuals = {a: {} for a in plan.actors}
    for step in range(steps):
        flats, _ = flatten_worker_grads(plan, make(step))
        want = reference.run_flat(flats)
        got, errors = run_step(plan, execs, residuals, step, flats, late=[plan.buckets[0].name], delay=0.05)
        assert not errors
        for w in range(workers):
            for bucket in want[w]:
                assert same_bits(got[f"worker:{w}"][bucket], want[w][bucket]), f"step {step} worker {w} {bucket}"
    mine = {k: v for r in residuals.values() for k, v in r.items()}
    assert mine.keys() == reference.state.residuals.keys()
    assert all(same_bits(v, reference.state.residuals[k]) for k, v in mine.items())


@pytest.mark.parametrize("kw", [dict(strategy="ring"), dict(strategy="ps"), dict(strategy="allgather")],
                         ids=["ring", "ps", "allgather"])
@pytest.mark.parametrize("codec", ["none", "onebit", "randomk:ratio=0.3"])
@pytest.mark.parametrize("compute_threads", [1, 3])
def test_ops_scan_their_partitions_as_a_scan_before_the_step_would(kw, codec, compute_threads):
    """Gradients provided unscanned to executors with a ``GradientScan``: each partition is scanned by the
    first op that reads it.  With NaN/Inf in several partitions (one tensor's on both sides of a partition
    boundary), the results and residuals are bit for bit those of a scan before the step, and each worker's
    reports are ``scan_worker``'s of its whole gradient (one per tensor); finite steps report nothing."""
    plan = casync.build_plan(SHAPES, workers=3, codec=codec, partitions=2, bucket_bytes=600, nonfinite="propagate",
                             **kw)
    bounds = [(b.name, stop) for b in plan.buckets for _, stop in b.partitions[:-1]]
    assert bounds, "the plan must split a bucket into partitions"

    def make(step):
        grads = make_grads(SHAPES, 3, seed=step)
        if step == 1:  # worker 0: NaN and Inf around the first partition boundary; worker 2: an Inf in "b"
            flat_w = grads[0]["w"].reshape(-1)
            flat_w[[0, 150, 151, 300]] = [np.nan, np.inf, np.nan, -np.inf]
            grads[2]["b"][3, 1] = np.inf
        return grads

    hub_a, hub_b = LocalHub(timeout_s=10), LocalHub(timeout_s=10)
    caller = executors(plan, hub_a, compute_threads=compute_threads)
    own = executors(plan, hub_b, compute_threads=compute_threads, scan=True)
    res_a, res_b = {a: {} for a in plan.actors}, {a: {} for a in plan.actors}
    for step in range(3):
        flats, _ = flatten_worker_grads(plan, make(step))
        want, errors_a = run_step(plan, caller, res_a, step, flats)
        got, errors_b = run_step(plan, own, res_b, step, flats, lazy=True)
        assert not errors_a and not errors_b
        for actor in plan.actors:
            assert all(same_bits(got[actor][b], want[actor][b]) for b in want[actor]), (step, actor)
            assert res_b[actor].keys() == res_a[actor].keys()
            assert all(same_bits(res_b[actor][k], v) for k, v in res_a[actor].items()), (step, actor)
        for w in range(3):
            expected, _ = scan_worker(layouts(plan), w, flats[w])
            assert sorted(own[f"worker:{w}"].nonfinite, key=str) == sorted(expected, key=str), (step, w)
        if step == 1:
            assert {(r.worker, r.tensor, r.nan, r.inf) for ex in own.values() for r in ex.nonfinite} == {
                (0, "w", 2, 2), (2, "b", 0, 1)}
        else:
            assert not any(ex.nonfinite for ex in own.values())


@pytest.mark.parametrize("strategy", ["ring", "ps", "allgather"])
def test_a_partition_only_a_onebit_encode_reads_is_scanned_only_when_its_payload_is_not_finite(strategy, monkeypatch):
    """Where an error-feedback onebit encode (or the merge handed to one) is a partition's only reader, its payload's
    scale says whether the partition was finite: finite steps read no partition a second time to scan it, and a
    partition with NaN/Inf is scanned after its encode and encoded again, checked (the results, residuals and
    reports of the test above hold for it); with codec none every partition is scanned before it is read."""
    checked = []
    real = GradientScan.check
    monkeypatch.setattr(GradientScan, "check", staticmethod(lambda values: checked.append(values.size) or real(values)))
    for codec in ("onebit", "none"):
        plan = casync.build_plan(SHAPES, workers=3, codec=codec, partitions=2, bucket_bytes=600, strategy=strategy,
                                 nonfinite="propagate")
        certified = {(i, a) for a, share in actor_shares(plan).items() for i in certifiers(share.ops, [
            i for i, op in enumerate(share.ops) if handed_to_encode(op.attrs, [share.ops[c].attrs for c in op.consumers])])}
        execs, residuals = executors(plan, LocalHub(timeout_s=10), scan=True), {a: {} for a in plan.actors}
        for step in range(2):
            checked.clear()
            flats, _ = flatten_worker_grads(plan, make_grads(SHAPES, 3, seed=step))
            _, errors = run_step(plan, execs, residuals, step, flats, lazy=True)
            assert not errors
            partitions = sum(len(b.partitions) for b in plan.buckets) * plan.workers
            if codec == "onebit":
                assert certified and len(checked) == partitions - len(certified), (step, len(checked))
                assert checked == [] or strategy == "ps"  # a co-located server reads its own partition too
            else:
                assert len(checked) == partitions


@pytest.mark.parametrize("strategy", ["ring", "ps", "allgather"])
def test_shared_memory_within_a_node_and_the_base_channel_between_nodes(strategy):
    """Two machines of two actors each (each machine's shared memory under a name prefix of its own): an actor
    maps only the arenas of the same-node actors it writes to, never another machine's, and the results over
    both paths are LocalEngine's."""
    plan = casync.build_plan(SHAPES, workers=4, codec="onebit", partitions=4, bucket_bytes=600, strategy=strategy)
    actors = plan.actors
    node_of = {a: f"n{2 * i // len(actors)}" for i, a in enumerate(actors)}
    layout = arenas(plan_transfers(plan), node_of)
    assert layout and {node_of[a] for a in layout} == {"n0", "n1"}  # each machine has arenas of its own
    hub, prefix = LocalHub(timeout_s=10), f"casynctest{os.getpid()}x{uuid.uuid4().hex[:6]}"
    channels = {a: ShmChannel(hub.channel(a), a, layout, f"{prefix}{node_of[a]}") for a in actors}
    try:
        for channel in channels.values():
            channel.attach()  # raised FileNotFoundError for the other machine's arenas
        for channel in channels.values():
            channel.unlink()
        check_hub_against_local_engine(plan, 1, execs=executors(plan, hub, channel=channels.__getitem__))
    finally:
        for channel in channels.values():
            channel.close()


@pytest.mark.parametrize("kw", [dict(strategy="ring"), dict(strategy="ps"), dict(strategy="ps", servers=2),
                                dict(strategy="ps", two_way=False)], ids=["ring", "ps", "ps-servers", "ps-oneway"])
@pytest.mark.parametrize("codec", ["none", "onebit", "topk:ratio=0.2", "randomk:ratio=0.2"])
@pytest.mark.parametrize("compute_threads", [1, 3])
def test_results_written_over_the_gradients_are_local_engines(kw, codec, compute_threads):
    """As the DDP hook runs with DDP's bucket buffers: each worker's results are written over the gradient it
    provided, and no write overtakes a read of the same partition (three steps, one bucket provided late)."""
    plan = casync.build_plan(SHAPES, workers=3, codec=codec, partitions=2, bucket_bytes=600, **kw)
    reference, hub = casync.LocalEngine(plan), LocalHub(timeout_s=10)
    execs, residuals = executors(plan, hub, compute_threads=compute_threads), {a: {} for a in plan.actors}
    assert all(execs[f"worker:{w}"].overwritable == {b.name for b in plan.buckets} for w in range(3))
    for step in range(3):
        flats, _ = flatten_worker_grads(plan, make_grads(SHAPES, 3, seed=step))
        want = reference.run_flat([{b: f.copy() for b, f in flat.items()} for flat in flats])
        got, errors = run_step(plan, execs, residuals, step, flats, late=[plan.buckets[0].name], delay=0.05,
                               here=True)
        assert not errors, errors
        for w in range(3):
            for bucket in want[w]:
                assert same_bits(flats[w][bucket], want[w][bucket]), f"step {step} worker {w} {bucket}"


def test_results_are_not_written_over_a_gradient_the_plan_reads_while_writing():
    """All-gather's output merge reads the gradient it would overwrite: refused, naming the bucket."""
    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, bucket_bytes=600, strategy="allgather")
    ex = executors(plan, LocalHub(timeout_s=10))["worker:0"]
    assert ex.overwritable == frozenset()
    bucket = plan.buckets[0]
    ex.begin(0, {})
    with pytest.raises(ValueError, match=f"worker:0.*{bucket.name}.*cannot be written over its gradient"):
        ex.provide(bucket.name, np.zeros(bucket.numel, np.float32), results_here=True)


@pytest.mark.parametrize("strategy", ["ring", "ps", "allgather"])
def test_result_buffers_reused_step_after_step_give_the_same_bits(strategy):
    """A caller that copies results away (Ray's return, the hook, the optimizer) hands the executor the same
    buffers every step, and the residuals a step replaced as the next step's spares: results and residuals
    are LocalEngine's, and the residuals a step reads are never written."""
    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, bucket_bytes=600, strategy=strategy)
    reference, hub = casync.LocalEngine(plan), LocalHub(timeout_s=10)
    execs, residuals = executors(plan, hub), {a: {} for a in plan.actors}
    out = {a: {b.name: np.full(b.numel, np.nan, np.float32) for b in plan.buckets} for a in plan.actors}
    spares, arrays = {a: {} for a in plan.actors}, []
    for step in range(4):
        flats, _ = flatten_worker_grads(plan, make_grads(SHAPES, 3, seed=step))
        want = reference.run_flat(flats)
        read = {a: {k: v.copy() for k, v in r.items()} for a, r in residuals.items()}
        before = dict(residuals)
        got, errors = run_step(plan, execs, residuals, step, flats, out=out, spares=spares)
        assert not errors
        for w in range(3):
            for bucket in want[w]:
                assert np.array_equal(got[f"worker:{w}"][bucket], want[w][bucket])
        for a in plan.actors:
            assert all(np.array_equal(before[a][k], v) for k, v in read[a].items()), f"{a}: a read residual changed"
        mine = {k: v for r in residuals.values() for k, v in r.items()}
        assert mine.keys() == reference.state.residuals.keys()
        assert all(np.array_equal(v, reference.state.residuals[k]) for k, v in mine.items())
        arrays.append({k: id(v) for r in residuals.values() for k, v in buffers(r).items()})  # where they are held
    for step in range(WARMUP_SYNCS, len(arrays)):  # what benchmarks count on: no fresh residual memory from here
        assert arrays[step] == arrays[step - 2]
    assert not set(arrays[3].values()) & set(arrays[2].values())


def test_result_buffers_of_the_wrong_shape_are_refused_naming_the_bucket():
    plan = casync.build_plan(SHAPES, workers=2, codec="onebit", bucket_bytes=600)
    ex = executors(plan, LocalHub(timeout_s=5))["worker:0"]
    good = {b.name: np.empty(b.numel, np.float32) for b in plan.buckets}
    name = plan.buckets[0].name
    for bad, why in [({**good, name: np.empty(3, np.float32)}, "shape"), ({**good, name: good[name].astype(np.float64)}, "float32"),
                     ({k: v for k, v in good.items() if k != name}, "one buffer per bucket")]:
        with pytest.raises(ValueError, match="worker:0") as info:
            ex.begin(0, {}, out=bad)
        assert name in str(info.value) and why in str(info.value)
    ex.begin(0, {}, out=good)  # a refused begin left nothing open


def test_nan_and_inf_ride_the_side_channel_exactly():
    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, nonfinite="propagate")
    grads = make_grads(SHAPES, 3)
    grads[1]["w"][[3, 200]] = [np.nan, np.inf]
    flats, _ = flatten_worker_grads(plan, grads)
    want = casync.LocalEngine(plan).run_flat(flats)
    hub = LocalHub(timeout_s=10)
    got, errors = run_step(plan, executors(plan, hub), {a: {} for a in plan.actors}, 0, flats)
    assert not errors
    for w in range(3):
        for bucket in want[w]:
            np.testing.assert_array_equal(got[f"worker:{w}"][bucket], want[w][bucket])  # NaN == NaN here


def test_a_missing_gradient_times_out_naming_what_it_waits_for():
    plan = casync.build_plan(SHAPES, workers=2, codec="onebit")
    hub = LocalHub(timeout_s=2)
    execs = executors(plan, hub, timeout_s=1.0)
    flats, _ = flatten_worker_grads(plan, make_grads(SHAPES, 2))
    flats[1] = {}  # worker 1 never hands its gradient over
    start = time.monotonic()
    _, errors = run_step(plan, execs, {a: {} for a in plan.actors}, 0, flats)
    assert time.monotonic() - start < 10
    assert isinstance(errors["worker:1"], SyncTimeoutError) and "gradients provided" in str(errors["worker:1"])
    assert isinstance(errors["worker:0"], (SyncTimeoutError, SyncError))
    assert "worker:1" in str(errors["worker:0"]) or "aborted" in str(errors["worker:0"])


def test_a_slow_backward_that_keeps_providing_is_not_cut_short():
    """timeout_s bounds a step's silence, not its length: six buckets handed over 0.4 s apart (2.4 s in all), with
    timeout_s=1, give LocalEngine's results (a backward slower than timeout_s on every rank is not a failure)."""
    plan, shapes = _many_buckets_plan("onebit")
    flats, _ = flatten_worker_grads(plan, make_grads(shapes, 2))
    want = casync.LocalEngine(plan).run_flat(flats)
    execs = executors(plan, LocalHub(timeout_s=5), timeout_s=1.0)
    got, errors = run_step(plan, execs, {a: {} for a in plan.actors}, 0, flats, gap=0.4)
    assert not errors, errors
    assert len(plan.buckets) * 0.4 > 2 * 1.0
    for w in range(2):
        assert all(same_bits(got[f"worker:{w}"][b], want[w][b]) for b in want[w])


def test_actors_on_different_plans_fail_clearly_not_silently():
    """A peer running another plan sends transfers this one does not expect: a named error, not a wrong sum."""
    plan_a = casync.build_plan(SHAPES, workers=2, strategy="ring", codec="onebit", partitions=2)
    plan_b = casync.build_plan(SHAPES, workers=2, strategy="ring", codec="onebit", partitions=4)
    hub = LocalHub(timeout_s=3)
    shares_a, shares_b = actor_shares(plan_a), actor_shares(plan_b)
    parts_a = {b.name: list(b.partitions) for b in plan_a.buckets}
    parts_b = {b.name: list(b.partitions) for b in plan_b.buckets}
    execs = {"worker:0": RankExecutor(shares_a["worker:0"], plan_a.codecs, 0, parts_a, hub.channel("worker:0"), 3),
             "worker:1": RankExecutor(shares_b["worker:1"], plan_b.codecs, 0, parts_b, hub.channel("worker:1"), 3)}
    flats, _ = flatten_worker_grads(plan_a, make_grads(SHAPES, 2))
    _, errors = run_step(plan_a, execs, {a: {} for a in plan_a.actors}, 0, flats)
    assert errors
    assert any("different plans" in str(e) or "bytes" in str(e) for e in errors.values())


def test_a_transfer_that_arrives_twice_fails_clearly():
    """A peer (on another plan) sending one transfer twice: a named error, not its readers released twice."""
    plan = casync.build_plan(SHAPES, workers=2, strategy="ring", codec="none", partitions=2)
    hub = LocalHub(timeout_s=3)
    ex = executors(plan, hub, timeout_s=3.0)["worker:0"]
    share = actor_shares(plan)["worker:0"]
    index = min(share.recvs, key=lambda i: share.ops[i].transfer)  # worker:0 takes several from worker:1
    op = share.ops[index]
    ex.begin(0, {})
    peer = hub.channel("worker:1")
    for _ in range(2):
        peer.isend(np.zeros(ex._layouts[index].nbytes, np.uint8), "worker:0", body_tag(op.transfer))
        peer.isend(np.array([op.transfer, 0, 0, 0], np.int64).view(np.uint8), "worker:0", HEADER_TAG)
    flats, _ = flatten_worker_grads(plan, make_grads(SHAPES, 2))
    for bucket, flat in flats[0].items():
        ex.provide(bucket, flat)
    with pytest.raises(SyncError, match=rf"unexpected message from worker:1: transfer {op.transfer} of step 0 \(this "
                                        r"actor is in step 0, and has it already\)"):
        ex.finish()


def test_a_step_cannot_begin_twice():
    plan = casync.build_plan(SHAPES, workers=2, codec="onebit")
    ex = executors(plan, LocalHub())["worker:0"]
    ex.begin(0, {})
    with pytest.raises(SyncError, match="still open"):
        ex.begin(1, {})


class SlowOneBit(OneBitCodec):
    """onebit whose encode also sleeps (releasing the GIL, as NumPy's array loops do), or with ``fail`` raises
    when it runs on an executor's extra compute thread."""

    name = "slow-onebit"

    def __init__(self, seconds: float = 0.05, fail: bool = False):
        self.seconds, self.fail = seconds, fail

    def params(self) -> dict:
        return {"seconds": self.seconds, "fail": self.fail}

    def encode(self, x, seed=0):
        time.sleep(self.seconds)
        if self.fail and threading.current_thread().name.startswith("casync-compute"):
            raise RuntimeError("encode failed on purpose")
        return super().encode(x, seed)


def _many_buckets_plan(codec, strategy="ps", workers=2):
    shapes = {f"t{i}": (64,) for i in range(6)}
    return casync.build_plan(shapes, workers=workers, strategy=strategy, codec=codec, partitions=1, bucket_bytes=0,
                             error_feedback=False), shapes


def test_compute_threads_run_ops_at_once():
    """Two compute threads overlap independent encodes (each op's record spans its own work), and the results
    stay those of LocalEngine."""
    plan, shapes = _many_buckets_plan(SlowOneBit(0.05))
    flats, _ = flatten_worker_grads(plan, make_grads(shapes, 2))
    want = casync.LocalEngine(plan).run_flat(flats)
    spans = {}
    for threads in (1, 2):
        execs = executors(plan, LocalHub(timeout_s=10), compute_threads=threads)
        got, errors = run_step(plan, execs, {a: {} for a in plan.actors}, 0, flats)
        assert not errors
        for w in range(2):
            for bucket in want[w]:
                assert np.array_equal(got[f"worker:{w}"][bucket], want[w][bucket])
        records = [r for r in execs["worker:0"]._records if r[0] == "encode"]
        busy = sum(end - start for _, _, _, start, end, *_ in records)
        spans[threads] = (max(r[4] for r in records) - min(r[3] for r in records), busy)
    one_span, one_busy = spans[1]
    two_span, two_busy = spans[2]
    assert one_span >= 0.95 * one_busy  # one thread: encodes one after another
    assert two_span < 0.75 * two_busy  # two threads: encodes overlap


def test_an_op_failing_on_a_helper_thread_fails_the_step_and_leaves_no_thread_behind():
    plan, shapes = _many_buckets_plan(SlowOneBit(0.02, fail=True))
    flats, _ = flatten_worker_grads(plan, make_grads(shapes, 2))
    start = time.monotonic()
    execs = executors(plan, LocalHub(timeout_s=5), timeout_s=5.0, compute_threads=3)
    _, errors = run_step(plan, execs, {a: {} for a in plan.actors}, 0, flats)
    assert time.monotonic() - start < 5  # not the timeout: the failure itself
    assert isinstance(errors["worker:0"], SyncError) and "encode failed on purpose" in str(errors["worker:0"])
    deadline = time.monotonic() + 5
    while _threads("casync-compute") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _threads("casync-compute")


def _threads(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def test_transport_threads_last_the_executor_not_a_step():
    """Each peer's sender and receiver thread is started once and serves every step (starting threads each
    step costs milliseconds on busy cores); they end when their executor is dropped."""
    plan = casync.build_plan(SHAPES, workers=3, codec="onebit", partitions=2, bucket_bytes=600, strategy="allgather")
    before = set(threading.enumerate())
    execs, residuals = executors(plan, LocalHub(timeout_s=10)), {a: {} for a in plan.actors}
    seen = []
    for step in range(3):
        flats, _ = flatten_worker_grads(plan, make_grads(SHAPES, 3, seed=step))
        _, errors = run_step(plan, execs, residuals, step, flats)
        assert not errors
        seen.append({t for t in threading.enumerate() if t not in before and t.name.startswith(("casync-send",
                                                                                                  "casync-recv"))})
    assert seen[0] == seen[1] == seen[2]
    assert len(seen[0]) == 3 * 2 * 2  # all-gather: each of 3 actors sends to and receives from 2 peers
    del execs
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in seen[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t.name for t in seen[0] if t.is_alive()]


class FailingOneBit(OneBitCodec):
    """onebit whose encode raises in a step (not when the executor learns its wire layout, in the main thread)."""

    name = "failing-onebit"

    def params(self) -> dict:
        return {}

    def encode(self, x, seed=0):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("encode failed on purpose")
        return super().encode(x, seed)


@pytest.mark.parametrize("compute_threads", [1, 3])
def test_an_op_failure_is_a_sync_error_naming_the_op_on_any_thread(compute_threads):
    plan, shapes = _many_buckets_plan(FailingOneBit())
    flats, _ = flatten_worker_grads(plan, make_grads(shapes, 2))
    execs = executors(plan, LocalHub(timeout_s=5), timeout_s=5.0, compute_threads=compute_threads)
    _, errors = run_step(plan, execs, {a: {} for a in plan.actors}, 0, flats)
    failed = [e for e in errors.values() if "encode failed on purpose" in str(e) and "aborted" not in str(e)]
    assert failed and all(type(e) is SyncError for e in failed)
    assert all(re.search(r"worker:\d, step 0: encode of bucket '\w+', partition 0 \(.+\) failed: RuntimeError",
                         str(e)) for e in failed), [str(e) for e in failed]


class PrivateAbortChannel(LocalChannel):
    """A LocalHub end whose abort refuses its own transfers and tells no peer, as a torch.distributed group's."""

    tells_peers_on_abort = False

    def __init__(self, hub, actor):
        super().__init__(hub, actor)
        self.aborted = None

    def isend(self, buf, peer, tag):
        if self.aborted:
            raise SyncError(f"{self.actor}: aborted: {self.aborted}")
        return super().isend(buf, peer, tag)

    def abort(self, reason):
        self.aborted = reason


@pytest.mark.parametrize("strategy", ["ring", "ps"])
def test_a_failing_actor_tells_its_peers_at_once_over_a_channel_whose_abort_does_not(strategy):
    plan, shapes = _many_buckets_plan(FailingOneBit(), strategy=strategy, workers=3)
    flats, _ = flatten_worker_grads(plan, make_grads(shapes, 3))
    hub = LocalHub(timeout_s=30)
    execs = executors(plan, hub, timeout_s=30.0, channel=lambda a: PrivateAbortChannel(hub, a))
    plain = {k: OneBitCodec() for k in plan.codecs}
    for actor in plan.actors:  # only worker:1's encodes fail
        if actor != "worker:1":
            execs[actor].codecs = plain
    start = time.monotonic()
    _, errors = run_step(plan, execs, {a: {} for a in plan.actors}, 0, flats)
    assert time.monotonic() - start < 10  # not the 30 s timeout
    assert set(errors) == set(plan.actors)
    assert "encode failed on purpose" in str(errors["worker:1"])
    for actor, error in errors.items():
        if actor != "worker:1":  # told directly, or by a peer that was told: the first failure's reason either way
            assert type(error) is SyncError, (actor, error)
            told = r"aborted its data plane: worker:1 failed in step 0: SyncError: .*encode failed on purpose"
            assert re.search(told, str(error)), (actor, str(error))


class OpeningChannel(PrivateAbortChannel):
    """A PrivateAbortChannel that refuses receives once aborted too (as a torch.distributed group's end does) and
    holds its first receive until ``go`` is set, saying so in ``opening``: an executor's ``begin`` paused midway."""

    def __init__(self, hub, actor):
        super().__init__(hub, actor)
        self.opening, self.go, self.held = threading.Event(), threading.Event(), False

    def irecv(self, buf, peer, tag):
        if not self.held:
            self.held = True
            self.opening.set()
            self.go.wait(10)
        if self.aborted:
            raise SyncError(f"{self.actor}: aborted: {self.aborted}")
        return super().irecv(buf, peer, tag)


def _abort_race(when):
    """Three ring workers over channels whose abort tells nobody; worker:1's host aborts its step ``"opening"``
    (while begin is posting the step's receives) or ``"before"`` it opens.  Returns each actor's error and the
    seconds the step took."""
    plan, shapes = _many_buckets_plan(OneBitCodec(), strategy="ring", workers=3)
    flats, _ = flatten_worker_grads(plan, make_grads(shapes, 3))
    hub = LocalHub(timeout_s=20)
    channels = {a: (OpeningChannel if a == "worker:1" else PrivateAbortChannel)(hub, a) for a in plan.actors}
    execs = executors(plan, hub, timeout_s=20.0, channel=channels.get)
    failing, channel = execs["worker:1"], channels["worker:1"]
    gave_up = RuntimeError("the host gave up")
    if when == "before":
        channel.go.set()
        failing.abort(gave_up)
    else:
        def abort_midway():
            channel.opening.wait(10)
            threading.Thread(target=failing.abort, args=(gave_up,), daemon=True).start()
            time.sleep(0.2)  # the abort waits for the step to be open
            channel.go.set()
        threading.Thread(target=abort_midway, daemon=True).start()
    start = time.monotonic()
    _, errors = run_step(plan, execs, {a: {} for a in plan.actors}, 0, flats)
    return errors, time.monotonic() - start


@pytest.mark.parametrize("when", ["opening", "before"])
def test_an_abort_racing_the_opening_of_a_step_still_tells_every_peer(when):
    """The host's abort (a DDP hook that raised on backward's thread) may come while its background thread is
    inside ``begin``: the step must not count as open before the peers it owes headers to are known, or the
    abort tells nobody and the others wait out their timeout (the hook test's 1-in-4 failure)."""
    errors, took = _abort_race(when)
    assert took < 5, errors  # not the 20 s timeout
    assert set(errors) == {"worker:0", "worker:1", "worker:2"}
    assert "the host gave up" in str(errors["worker:1"])
    for actor in ("worker:0", "worker:2"):
        assert re.search(r"aborted its data plane: worker:1 failed in step 0: RuntimeError: the host gave up",
                         str(errors[actor])), (actor, str(errors[actor]))


def test_a_gradient_of_the_wrong_dtype_or_size_is_refused_naming_the_bucket():
    plan = casync.build_plan(SHAPES, workers=2, codec="onebit", bucket_bytes=600)
    ex = executors(plan, LocalHub())["worker:0"]
    bucket = plan.buckets[0]
    ex.begin(0, {})
    with pytest.raises(ValueError, match=rf"worker:0: the gradient of bucket '{bucket.name}' must be a flat float32 "
                                         rf"array of shape \({bucket.numel},\), got float64"):
        ex.provide(bucket.name, np.zeros(bucket.numel, np.float64))
    with pytest.raises(ValueError, match=rf"shape \({bucket.numel},\), got float32 \({bucket.numel + 1},\)"):
        ex.provide(bucket.name, np.zeros(bucket.numel + 1, np.float32))
    with pytest.raises(ValueError, match="bucket 'nope', which the plan does not have"):
        ex.provide("nope", np.zeros(3, np.float32))


def test_compute_threads_must_be_a_positive_int():
    plan = casync.build_plan(SHAPES, workers=2, codec="onebit")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="compute_threads"):
            executors(plan, LocalHub(), compute_threads=bad)
