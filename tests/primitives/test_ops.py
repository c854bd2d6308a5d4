"""The primitives' fused paths give the same floats as the plain ones every engine can fall back to."""
from __future__ import annotations

import numpy as np
import pytest

from casync.primitives.codecs import available_codecs, get_codec
from casync.primitives.ops import Deferred, Sparse, run_merge, run_node

BLOCKWISE = [name for name in available_codecs() if get_codec(name).decodes_in_blocks]


def gaussian(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_the_codecs_that_decode_in_blocks_are_the_expanding_ones():
    assert {"onebit", "terngrad", "tbq", "fp16"} <= set(BLOCKWISE)


@pytest.mark.parametrize("name", BLOCKWISE)
@pytest.mark.parametrize("n", [1, 1003, 600_001])
@pytest.mark.parametrize("deferred_at", [(0,), (1,), (0, 2), (0, 1, 2, 3)])
@pytest.mark.parametrize("divisor", [1, 4])
def test_a_merge_of_deferred_decodes_equals_the_merge_of_decoded_arrays(name, n, deferred_at, divisor):
    """Decoding block by block inside the merge (600,001 floats: several blocks and a ragged end) adds the
    same floats in the same order as decoding first; into a given ``out`` too."""
    codec = get_codec(name)
    count = max(deferred_at) + 1 if len(deferred_at) > 1 else 3
    payloads = [codec.encode(gaussian(n, seed=i), seed=i) for i in range(count)]
    plain = [codec.decode(p, n) if i in deferred_at else gaussian(n, seed=10 + i) for i, p in enumerate(payloads)]
    fused = [Deferred(codec, p, n) if i in deferred_at else plain[i] for i, p in enumerate(payloads)]
    expected = run_merge(plain, divisor)
    assert run_merge(fused, divisor).tobytes() == expected.tobytes()
    out = np.full(n, np.float32(3.0))
    assert run_merge(fused, divisor, out) is out and out.tobytes() == expected.tobytes()


def test_run_node_defers_only_where_asked_and_the_codec_can():
    n = 1000
    attrs = {"op": "decode", "codec": "c", "numel": n, "bucket": "b", "part": 0}
    for name, kind in (("onebit", Deferred), ("topk", Sparse), ("randomk", Sparse), ("none", np.ndarray)):
        codec = get_codec(name)
        payload = codec.encode(gaussian(n, seed=1), seed=1)
        kw = {"codecs": {"c": codec}, "residuals": None, "plan_seed": 0, "step": 0}
        assert type(run_node(attrs, [payload], None, defer=True, **kw)) is kind
        assert type(run_node(attrs, [payload], None, **kw)) is np.ndarray


def test_a_subclass_that_overrides_encode_or_decode_gets_the_plain_paths_that_call_them():
    """A codec built on onebit (a wrapper that logs, gates or tweaks encode/decode) must see every call:
    the fused paths of its parent would go around its own methods."""
    from casync.primitives.codecs.sign import OneBitCodec
    from casync.primitives.ops import run_encode

    calls = []

    class Logged(OneBitCodec):
        name = "logged-onebit"

        def encode(self, x, seed=0):
            calls.append("encode")
            return super().encode(x, seed)

        def decode(self, payload, n):
            calls.append("decode")
            return super().decode(payload, n)

    codec, x = Logged(), gaussian(1000, seed=3)
    residuals = {"k": gaussian(1000, seed=4)}
    expected = run_encode(get_codec("onebit"), x, 7, dict(residuals), "k")
    payload = run_encode(codec, x, 7, residuals, "k")  # with a residual: the fused path in onebit
    assert calls == ["encode", "decode"] and payload["bits"].tobytes() == expected["bits"].tobytes()
    out = np.empty(1000, np.float32)
    assert codec.decode_into(payload, 1000, out) is out and calls[-1] == "decode"
    assert not codec.decodes_in_blocks and OneBitCodec.decodes_in_blocks


EF_CODECS = [name for name in available_codecs() if get_codec(name).ef_sound]


@pytest.mark.parametrize("name", EF_CODECS)
@pytest.mark.parametrize("n", [1003, 600_001])
def test_an_error_feedback_encode_writes_its_residual_into_the_spare_with_the_same_bits(name, n):
    """A recycled residual buffer changes where the new residual lives, never its floats or the payload."""
    from casync.primitives.ops import run_encode

    codec, x, old = get_codec(name), gaussian(n, 1), gaussian(n, 2) * 0.1
    plain = {"k": old.copy()}
    want = run_encode(codec, x, 7, plain, "k")
    spare = np.full(n, np.nan, np.float32)
    recycled, spares = {"k": old.copy()}, {"k": spare}
    got = run_encode(codec, x, 7, recycled, "k", spares=spares)
    assert recycled["k"] is spare and not spares  # taken, and used
    np.testing.assert_array_equal(recycled["k"], plain["k"])
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)


def test_a_spare_that_does_not_fit_or_overlaps_is_left_alone():
    from casync.primitives.ops import run_encode

    codec, x = get_codec("onebit"), gaussian(1000, 1)
    for spare in (np.zeros(999, np.float32), np.zeros(1000, np.float64), x):
        residuals = {"k": np.zeros(1000, np.float32)}
        before = spare.copy()
        run_encode(codec, x, 0, residuals, "k", spares={"k": spare})
        assert residuals["k"] is not spare
        np.testing.assert_array_equal(spare, before)
