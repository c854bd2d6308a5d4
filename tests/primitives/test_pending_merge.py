"""A merge handed to the error-feedback encode that alone reads it (``casync.primitives.merge.PendingMerge``) gives the
bits of merging first: block by block, inside every codec that takes one, and through ``run_encode``."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casync.primitives.codecs import get_codec
from casync.primitives.codecs.base import merges_pending
from casync.primitives.codecs.sparse import TopKCodec
from casync.primitives.merge import Deferred, PendingMerge, Sparse, merges_in_encode, run_merge
from casync.primitives.ops import run_encode, run_node
from tests.helpers import same_bits, same_bits_but_nans
from tests.primitives.test_sparse_merge import gaussian, merges, with_zeros

FUSED = ["onebit", "fp16", "randomk:ratio=0.01", "topk:ratio=0.01", "tbq"]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the cases overflow on purpose
@settings(max_examples=300, deadline=None)
@given(merges(), st.data())
def test_any_block_of_a_pending_merge_is_that_block_of_the_merge(case, data):
    """Dense and sparse inputs with signed zeros, NaN, Inf and overflow, cut into arbitrary blocks."""
    inputs, _, divisor = case
    n = inputs[0].size if isinstance(inputs[0], np.ndarray) else inputs[0].n
    expected = run_merge(inputs, divisor)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, n - 1)), max_size=4)) - {n})
    got = np.full(n, np.float32(7.0))
    pending = PendingMerge(inputs, divisor, n)
    for start, stop in zip([0] + cuts, cuts + [n]):
        pending.into(start, stop, got[start:stop])
    assert same_bits_but_nans(got, expected)  # (a block of one element may end in the other of two NaNs)
    assert same_bits(pending.run(), expected)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_block_of_one_element_holds_a_nan_where_the_merge_does():
    """Inf + -Inf + NaN: the merge's NaN and a one-element block's differ only in which NaN they are."""
    inf, nan = np.zeros((3, 8), np.float32), np.float32(np.nan)
    inf[0, 7], inf[1, 7], inf[2, 7] = np.inf, -np.inf, nan
    inputs = [inf[0], Sparse(np.array([], np.uint32), np.array([], np.float32), 8), inf[1], inf[2]]
    expected, got = run_merge(inputs, 1), np.empty(8, np.float32)
    pending = PendingMerge(inputs, 1, 8)
    for start, stop in [(0, 1), (1, 7), (7, 8)]:
        pending.into(start, stop, got[start:stop])
    assert np.isnan(got[7]) and same_bits_but_nans(got, expected) and same_bits(got[:7], expected[:7])


def ring_hop(n: int) -> list:
    """A ring hop's inputs: the local chunk and a onebit payload decoded block by block (``Deferred``)."""
    onebit = get_codec("onebit")
    return [with_zeros(gaussian(n, 1), 2), Deferred(onebit, onebit.encode(gaussian(n, 3)), n)]


def ps_server(n: int) -> list:
    """A co-located PS server's inputs: its own partition and three workers' randomk entries."""
    randomk = get_codec("randomk:ratio=0.01")
    pushes = [randomk.encode(with_zeros(gaussian(n, 10 + i), 20 + i), seed=i) for i in range(3)]
    return [with_zeros(gaussian(n, 4), 5)] + [Sparse(*randomk.sparse_entries(p, n), n) for p in pushes]


@pytest.mark.parametrize("spec", FUSED)
@pytest.mark.parametrize("inputs", [ring_hop, ps_server])
@pytest.mark.parametrize("n", [1003, 600_001])
@pytest.mark.parametrize("into_out", [False, True])
def test_encoding_a_pending_merge_gives_the_bits_of_merging_first(spec, inputs, n, into_out):
    """Payload and residual, for every codec whose error-feedback encode takes one, below and above the
    sizes where the codecs switch to their blocked paths; into a recycled buffer too."""
    codec = get_codec(spec)
    assert merges_in_encode(codec)
    parts = inputs(n)
    residual = gaussian(n, 9) * np.float32(0.1)
    merged = run_merge(parts, 4)
    want_payload, want_residual = codec.encode_feedback(merged, residual, seed=5,
                                                        out=np.empty(n, np.float32) if into_out else None)
    out = np.full(n, np.float32(2.0)) if into_out else None
    payload, new_residual = codec.encode_feedback(PendingMerge(parts, 4, n), residual, seed=5, out=out)
    assert new_residual.tobytes() == want_residual.tobytes()
    assert new_residual is out or not into_out
    assert payload.keys() == want_payload.keys()
    for key in payload:
        assert payload[key].tobytes() == want_payload[key].tobytes(), key


class UnmarkedTopK(TopKCodec):
    """An override of encode_feedback that does not say it takes a pending merge: it must get arrays only."""

    name = "unmarked-topk"

    def encode_feedback(self, x, residual, seed=0, out=None):
        assert isinstance(x, np.ndarray), type(x)
        return super().encode_feedback(x, residual, seed, out)


class MarkedTopK(UnmarkedTopK):
    name = "marked-topk"

    @merges_pending
    def encode_feedback(self, x, residual, seed=0, out=None):
        return TopKCodec.encode_feedback(self, x, residual, seed, out)


def test_only_a_marked_encode_feedback_is_handed_a_pending_merge():
    assert not merges_in_encode(UnmarkedTopK) and merges_in_encode(MarkedTopK) and merges_in_encode(TopKCodec)
    assert not merges_in_encode(get_codec("terngrad"))  # error feedback through its contractive encode
    n = 5000
    parts = ps_server(n)
    merged = run_merge(parts, 4)
    for codec in (UnmarkedTopK(0.01), MarkedTopK(0.01), get_codec("terngrad")):
        residuals = {"r": gaussian(n, 7)}
        want = {"r": residuals["r"].copy()}
        want_payload = run_encode(codec, merged, 3, want, "r")
        payload = run_encode(codec, PendingMerge(parts, 4, n), 3, residuals, "r", spares={"r": np.empty(n, np.float32)})
        assert residuals["r"].tobytes() == want["r"].tobytes(), codec.name
        assert all(payload[k].tobytes() == want_payload[k].tobytes() for k in payload), codec.name


@pytest.mark.parametrize("ef", [True, False])
def test_a_pending_merge_that_may_hold_nonfinite_values_or_has_no_residual_is_merged_first(ef):
    """``check`` (a NaN/Inf may be there: nonfinite="propagate") and encodes without error feedback take the
    whole merged tensor, with the same result as merging first."""
    n = 4096
    parts = ring_hop(n)
    parts[0] = parts[0].copy()
    parts[0][[3, 100]] = [np.nan, np.inf]
    codec = get_codec("onebit")
    merged = run_merge(parts, 2)
    want_res = {"r": gaussian(n, 1)} if ef else None
    got_res = {"r": want_res["r"].copy()} if ef else None
    want = run_encode(codec, merged, 11, want_res, "r" if ef else None, check=True)
    got = run_encode(codec, PendingMerge(parts, 2, n), 11, got_res, "r" if ef else None, check=True)
    assert want.keys() == got.keys() and all(want[k].tobytes() == got[k].tobytes() for k in want)
    if ef:
        assert got_res["r"].tobytes() == want_res["r"].tobytes()


def test_run_node_defers_a_merge_only_when_asked():
    n = 1000
    attrs = {"op": "merge", "local_input": True, "local_slot": 0, "divisor": 4, "numel": n}
    parts = ps_server(n)
    kwargs = dict(codecs={}, residuals={}, plan_seed=0, step=0)
    pending = run_node(attrs, parts[1:], parts[0], defer=True, **kwargs)
    assert isinstance(pending, PendingMerge) and pending.shape == (n,)
    merged = run_node(attrs, parts[1:], parts[0], **kwargs)
    assert isinstance(merged, np.ndarray) and pending.run().tobytes() == merged.tobytes()
