"""The sparsifiers' blocked passes: decodes into reused buffers (``casync.primitives.codecs.base.scattered``) and
randomk's error-feedback encode, block by block where they can be, always the bits of the whole-array passes."""
from __future__ import annotations

import numpy as np
import pytest

from casync.primitives.codecs import get_codec
from casync.primitives.codecs.base import SCATTER_BLOCK, Codec, scattered

B = SCATTER_BLOCK


def plain(n: int, indices: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.zeros(n, np.float32)
    out[indices] = values
    return out


def stale(n: int, seed: int) -> np.ndarray:
    """A reused buffer: last step's values, -0.0 and NaN among them."""
    out = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    out[::7], out[::11] = -0.0, np.nan
    return out


@pytest.mark.parametrize("n", [2 * B - 1, 2 * B, 2 * B + 1, 5 * B + 7])
@pytest.mark.parametrize("case", ["random", "block edges", "ends", "one block only", "duplicates"])
def test_blocks_give_the_bits_of_clear_then_scatter(n, case):
    rng = np.random.default_rng(n)
    if case == "random":
        indices = np.sort(rng.choice(n, size=n // 100, replace=False))
    elif case == "block edges":
        indices = np.array(sorted({i for b in range(B, n, B) for i in (b - 1, b, b + 1) if i < n}))
    elif case == "ends":
        indices = np.array([0, n - 1])
    elif case == "one block only":  # every entry in the last block: the others are only cleared
        indices = np.arange(n - 5, n)
    else:  # ascending with repeats (a malformed payload): the last value written wins, as with one scatter
        indices = np.repeat(np.sort(rng.choice(n, size=50, replace=False)), 2)
    indices = indices.astype(np.uint32)
    values = rng.standard_normal(indices.size).astype(np.float32)
    values[::3] = -0.0
    out = stale(n, 1)
    got = scattered(out, n, indices, values)
    assert got is out
    assert got.tobytes() == plain(n, indices, values).tobytes()


@pytest.mark.parametrize("indices", [np.array([5, 3, 2 * B + 1], np.int64),  # out of order
                                     np.array([-1, 4, 2 * B], np.int64)],  # a negative index wraps around
                         ids=["unsorted", "negative"])
def test_indices_that_are_not_ascending_and_in_range_are_scattered_whole_as_before(indices):
    n = 3 * B
    values = np.arange(1, indices.size + 1, dtype=np.float32)
    assert scattered(stale(n, 2), n, indices, values).tobytes() == plain(n, indices, values).tobytes()


def test_an_index_past_the_end_raises_like_a_plain_scatter():
    n = 3 * B
    with pytest.raises(IndexError):
        scattered(stale(n, 3), n, np.array([1, n], np.int64), np.ones(2, np.float32))


@pytest.mark.parametrize("spec", ["topk:ratio=0.01", "randomk:ratio=0.01"])
def test_decode_into_a_stale_buffer_matches_a_fresh_decode(spec):
    codec = get_codec(spec)
    n = 3 * B + 12345
    x = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    payload = codec.encode(x, seed=9)
    assert codec.decode_into(payload, n, stale(n, 5)).tobytes() == codec.decode(payload, n).tobytes()


@pytest.mark.parametrize("n", [2 * B - 1, 2 * B, 3 * B + 5])
@pytest.mark.parametrize("into", [False, True], ids=["fresh", "into a spare"])
def test_randomk_feedback_encode_in_blocks_gives_the_bits_of_add_then_take(n, into):
    codec = get_codec("randomk:ratio=0.05")
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    residual = stale(n, 6)  # -0.0 and NaN among them
    residual[5::13] = 3e38
    x[5::13] = 3e38  # overflows to Inf in the sum
    with np.errstate(over="ignore", invalid="ignore"):
        payload, remainder = codec.encode_feedback(x, residual, seed=11, out=stale(n, 7) if into else None)
        expected, expected_remainder = Codec.encode_feedback(codec, x, residual, seed=11)
    assert payload.keys() == expected.keys()
    assert all(payload[k].tobytes() == expected[k].tobytes() for k in payload)
    assert remainder.tobytes() == expected_remainder.tobytes()
