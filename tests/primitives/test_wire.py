"""Payloads as wire buffers: every codec's payload packs into its layout's bytes and unpacks to the same arrays;
a payload that does not fit its layout is refused, naming both."""
from __future__ import annotations

import numpy as np
import pytest

from casync.primitives.codecs import available_codecs, get_codec
from casync.primitives.finite import NF_INDEX, NF_VALUE
from casync.primitives.wire import layout

CODECS = [get_codec({"topk": "topk:ratio=0.1", "randomk": "randomk:ratio=0.1"}.get(n, n)) for n in available_codecs()]


@pytest.mark.parametrize("codec", CODECS, ids=str)
@pytest.mark.parametrize("n", [1, 13, 4099])
def test_every_codecs_payload_round_trips_through_its_wire_buffer(codec, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    payload = codec.encode(x, 7)
    lay = layout(codec, n)
    buf = lay.pack(payload)
    assert buf.dtype == np.uint8 and buf.shape == (lay.nbytes,) == (codec.compressed_nbytes(n),)
    for key, value in lay.unpack(buf.copy()).items():
        assert value.dtype == payload[key].dtype and value.shape == payload[key].shape
        assert value.tobytes() == payload[key].tobytes()
    into = np.full(lay.nbytes, 0xAB, np.uint8)
    assert lay.pack(payload, out=into) is into and into.tobytes() == buf.tobytes()


def test_a_single_array_payload_is_sent_without_a_copy_and_the_side_channel_is_not_its_business():
    codec, n = get_codec("none"), 100
    x = np.arange(n, dtype=np.float32)
    payload = {**codec.encode(x), NF_INDEX: np.array([3]), NF_VALUE: np.array([np.nan], np.float32)}
    buf = layout(codec, n).pack(payload)
    assert np.shares_memory(buf, x) and buf.nbytes == 4 * n


@pytest.mark.parametrize("change", ["missing", "extra", "dtype", "shape"])
def test_a_payload_that_does_not_fit_its_layout_is_refused_naming_both(change):
    codec, n = get_codec("onebit"), 64
    payload = dict(codec.encode(np.ones(n, np.float32)))
    if change == "missing":
        del payload["scale"]
    elif change == "extra":
        payload["spare"] = np.zeros(1, np.float32)
    elif change == "dtype":
        payload["scale"] = payload["scale"].astype(np.float64)
    else:
        payload["bits"] = payload["bits"][:-1]
    with pytest.raises(ValueError, match="do not match the codec's layout .*'bits'"):
        layout(codec, n).pack(payload)


def test_a_buffer_of_the_wrong_size_is_refused():
    lay = layout(get_codec("onebit"), 64)
    with pytest.raises(ValueError, match=f"a wire buffer of {lay.nbytes} bytes was expected"):
        lay.unpack(np.zeros(lay.nbytes + 1, np.uint8))
