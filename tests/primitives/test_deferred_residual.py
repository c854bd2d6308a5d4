"""Residuals left deferred (``casync.primitives.codecs.residual``, ``casync.primitives.residuals``): the payloads and
residuals of the eager error-feedback encode, bit for bit, step after step; and no reader outside the encodes ever sees
anything but arrays."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from casync.primitives.codecs import get_codec
from casync.primitives.codecs.base import BLOCK
from casync.primitives.codecs.residual import DeferredResidual
from casync.primitives.codecs.sign import OneBitCodec
from casync.primitives.merge import Deferred, PendingMerge
from casync.primitives.ops import run_encode
from casync.primitives.residuals import Residuals, buffers
from tests.helpers import same_bits
from tests.primitives.test_sparse_merge import gaussian, with_zeros

SIZES = [1, 7, 8, 1000, BLOCK, BLOCK + 13, 2 * BLOCK + 8]


def same_payload(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("merge", [False, True], ids=["array", "pending merge"])
def test_deferred_encodes_give_the_eager_payloads_and_residuals_step_after_step(n, merge):
    """Four steps of onebit's error feedback, eager against deferred (with and without recycled buffers, on an
    array and on a ring hop's merge still to run): the same payload bits and scales, and each deferred residual
    materializes to the eager residual's bits, signed zeros included."""
    codec = OneBitCodec()
    eager = deferred = with_zeros(gaussian(n, 1), 2) * np.float32(0.1)
    spare = None
    for step in range(4):
        x = with_zeros(gaussian(n, 10 + step), 20 + step)
        if merge:
            hop = codec.encode(gaussian(n, 30 + step))
            x = PendingMerge([x, Deferred(codec, hop, n)], 2 if step % 2 else 1, n)
        want, eager = codec.encode_feedback(x, eager, seed=step)
        got, new = codec.encode_feedback_deferred(x, deferred, seed=step, out=spare)
        assert isinstance(new, DeferredResidual) and new.codec is codec
        assert same_payload(got, want), f"step {step}"
        assert same_bits(new.materialize(), eager), f"step {step}"
        spare = deferred.corrected if isinstance(deferred, DeferredResidual) else None  # two steps back
        deferred = new


def test_a_deferred_encode_never_writes_the_residual_it_reads():
    """The residual read stays as it was (a voided step rolls back to it), and so does its payload."""
    codec, n = OneBitCodec(), BLOCK + 100
    _, first = codec.encode_feedback_deferred(gaussian(n, 1), gaussian(n, 2) * np.float32(0.1))
    before, bits = first.materialize(), first.payload["bits"].copy()
    codec.encode_feedback_deferred(gaussian(n, 3), first, out=np.empty(n, np.float32))
    assert same_bits(first.materialize(), before) and same_bits(first.payload["bits"], bits)


def test_a_subclass_that_encodes_its_own_way_does_not_inherit_the_deferred_encode():
    class Shifted(OneBitCodec):
        name = "shifted-onebit-test"

        def encode(self, x, seed=0):
            return super().encode(x + np.float32(1), seed)

    assert OneBitCodec.defers_residual and not Shifted.defers_residual


def test_reading_a_store_gives_arrays_and_leaves_it_deferred():
    codec, n = OneBitCodec(), 3000
    _, deferred = codec.encode_feedback_deferred(gaussian(n, 1), gaussian(n, 2))
    plain = gaussian(n, 3)
    store = Residuals({"a": deferred, "b": plain})
    want = deferred.materialize()
    assert same_bits(store["a"], want) and store["b"] is plain
    assert same_bits(dict(store)["a"], want) and all(isinstance(v, np.ndarray) for v in store.values())
    assert store.raw("a") is deferred and store.deferred() == 1  # reading changed nothing stored
    assert buffers(store) == {"a": deferred.corrected, "b": plain}
    back = pickle.loads(pickle.dumps(store))
    assert same_bits(back["a"], want) and back.deferred() == 1
    copy = Residuals(store)
    copy["a"] = plain
    assert store.raw("a") is deferred, "a copy of a store is its own"


@pytest.mark.parametrize("codec_name", ["onebit", "topk:ratio=0.01", "fp16"])
def test_run_encode_into_a_store_matches_run_encode_into_a_dict(codec_name):
    """The executor's store (deferring where the codec can) against a plain dict (never deferring): the same
    payloads and residual bits over steps; the dict holds arrays only."""
    codec, n, key = get_codec(codec_name), BLOCK + 999, "worker:0/b/0"
    store, plain = Residuals(), {}
    for step in range(4):
        x = gaussian(n, step)
        spares = {key: buffers(store)[key]} if step >= 2 else None  # never the one being read: begin's rule
        want = run_encode(codec, x, step, plain, key)
        got = run_encode(codec, x, step, store, key, spares=dict(spares) if spares else None)
        assert same_payload(got, want) and same_bits(store[key], plain[key]), f"step {step}"
        assert all(isinstance(v, np.ndarray) for v in plain.values())
    assert store.deferred() == (1 if codec.defers_residual else 0)


def test_a_flagged_encode_reads_a_deferred_residual_as_its_array():
    """A partition with NaN/Inf takes the checked path: it reads the residual's array and stores an array,
    zero where the NaN/Inf were (as with a plain dict)."""
    codec, n, key = OneBitCodec(), 2000, "worker:0/b/0"
    store, plain = Residuals(), {}
    for step, bad in enumerate([False, False, True, False]):
        x = gaussian(n, step)
        if bad:
            x[[3, 1500]] = [np.nan, np.inf]
        want = run_encode(codec, x, step, plain, key, check=bad)
        got = run_encode(codec, x, step, store, key, check=bad)
        assert same_payload(got, want) and same_bits(store[key], plain[key]), f"step {step}"
        assert isinstance(store.raw(key), np.ndarray) == (bad or step == 0)  # step 0 had no residual to add
