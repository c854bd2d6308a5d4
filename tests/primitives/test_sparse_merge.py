"""A merge that adds sparsifiers' entries at their indices gives the bits of decoding them first and adding
whole tensors: the same nonzero sums, and the same signed zeros where the tensors' +0.0 would have
turned a -0.0 into +0.0."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casync.primitives.codecs import get_codec
from casync.primitives.ops import Sparse, run_merge, run_node

SPARSIFIERS = ["topk:ratio=0.01", "randomk:ratio=0.01", "topk:ratio=0.3", "randomk:ratio=0.5"]
NZ = np.float32(-0.0)


def gaussian(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def with_zeros(x: np.ndarray, seed: int) -> np.ndarray:
    """``x`` with a third of its elements -0.0 and a third +0.0 (ReLU-masked gradients hold both)."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, 3, x.size)
    x = x.copy()
    x[pick == 0] = NZ
    x[pick == 1] = 0.0
    return x


def decoded_merge(codec, payloads, dense_at, dense, n, divisor):
    plain = [dense[i] if i in dense_at else codec.decode(p, n) for i, p in enumerate(payloads)]
    return run_merge(plain, divisor)


@pytest.mark.parametrize("spec", SPARSIFIERS)
@pytest.mark.parametrize("n", [1, 1003, 600_001])
@pytest.mark.parametrize("dense_at", [(), (0,), (1,), (3,)])
@pytest.mark.parametrize("divisor", [1, 4])
@pytest.mark.parametrize("zeros", [False, True])
def test_sparse_entries_merge_to_the_bits_of_decoded_tensors(spec, n, dense_at, divisor, zeros):
    """All sparse (allgather), a dense local input first (ring), in the middle or last (co-located PS),
    on gradients with and without signed zeros; into a given ``out`` too."""
    codec = get_codec(spec)
    grads = [gaussian(n, seed=i) for i in range(4)]
    if zeros:
        grads = [with_zeros(g, seed=10 + i) for i, g in enumerate(grads)]
    payloads = [codec.encode(g, seed=i) for i, g in enumerate(grads)]
    expected = decoded_merge(codec, payloads, dense_at, grads, n, divisor)
    fused = [grads[i] if i in dense_at else Sparse(*codec.sparse_entries(p, n), n) for i, p in enumerate(payloads)]
    assert run_merge(fused, divisor).tobytes() == expected.tobytes()
    out = np.full(n, np.float32(3.0))
    assert run_merge(fused, divisor, out) is out and out.tobytes() == expected.tobytes()


SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3e38, -3e38, np.inf, -np.inf, np.nan]
value = st.sampled_from(SPECIALS)


@st.composite
def merges(draw):
    """Up to 5 inputs of length <= 12, each dense (any values) or sparse (a random index subset)."""
    n = draw(st.integers(1, 12))
    count = draw(st.integers(1, 5))
    inputs, plain = [], []
    for _ in range(count):
        if draw(st.booleans()):
            x = np.array(draw(st.lists(value, min_size=n, max_size=n)), np.float32)
            inputs.append(x)
            plain.append(x)
        else:
            idx = np.array(sorted(draw(st.sets(st.integers(0, n - 1), max_size=n))), np.uint32)
            vals = np.array(draw(st.lists(value, min_size=idx.size, max_size=idx.size)), np.float32)
            inputs.append(Sparse(idx, vals, n))
            x = np.zeros(n, np.float32)
            x[idx] = vals
            plain.append(x)
    return inputs, plain, draw(st.sampled_from([1, 3, 4]))


@settings(max_examples=400, deadline=None)
@given(merges())
def test_any_mix_of_sparse_and_dense_inputs_merges_bit_for_bit(case):
    """Signed zeros, Inf - Inf, NaN and overflow in every position and order."""
    inputs, plain, divisor = case
    with np.errstate(over="ignore"):  # 3e38 + 3e38: Inf, in both
        assert run_merge(inputs, divisor).tobytes() == run_merge(plain, divisor).tobytes()


def test_a_payload_whose_indices_are_out_of_order_is_decoded_whole():
    """``sparse_entries`` gives None (the merge must not trust unsorted indices); run_node then decodes it,
    and a bad index still fails as decoding fails."""
    codec, n = get_codec("topk:ratio=0.01"), 10_000
    payload = codec.encode(gaussian(n, 1), seed=1)
    attrs = {"op": "decode", "codec": "c", "numel": n, "bucket": "b", "part": 0}
    kw = {"codecs": {"c": codec}, "residuals": None, "plan_seed": 0, "step": 0, "defer": True}
    shuffled = {"indices": payload["indices"][::-1].copy(), "values": payload["values"][::-1].copy()}
    assert codec.sparse_entries(shuffled, n) is None
    got = run_node(attrs, [shuffled], None, **kw)
    assert isinstance(got, np.ndarray) and got.tobytes() == codec.decode(payload, n).tobytes()
    bad = {"indices": payload["indices"].copy(), "values": payload["values"]}
    bad["indices"][-1] = n
    assert codec.sparse_entries(bad, n) is None
    with pytest.raises(IndexError):
        run_node(attrs, [bad], None, **kw)


def test_a_subclass_that_overrides_decode_is_not_merged_sparsely():
    """A wrapper's own ``decode`` must see every decode: the parent's entries would go around it."""
    from casync.primitives.codecs.sparse import TopKCodec

    class Logged(TopKCodec):
        name = "logged-topk"

        def decode(self, payload, n):
            return super().decode(payload, n)

    assert TopKCodec.decodes_sparse and not Logged().decodes_sparse
