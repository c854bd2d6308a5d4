"""onebit's C sweep kernel against the NumPy sweep: the same payload bits, scales and corrected floats, bit for bit."""
from __future__ import annotations

import platform

import numpy as np
import pytest

from casync.primitives.codecs import sign_kernel
from casync.primitives.codecs.base import BLOCK
from casync.primitives.codecs.residual import DeferredResidual
from casync.primitives.codecs.sign import OneBitCodec
from casync.primitives.merge import Deferred, PendingMerge, run_merge

CODEC = OneBitCodec()
# fewer than 128 floats: NumPy alone; 128-191: 2 lanes; 1000: 15 lanes (rows straddle the 8-wide vectors);
# 600 * 64: 600 lanes (a multiple of 8); ragged last blocks after full ones
SIZES = [1, 9, 127, 128, 129, 191, 1000, 4103, 600 * 64, BLOCK - 8, BLOCK, BLOCK + 200, 2 * BLOCK + 8]
# (input, residual): a plain encode, an error-feedback one with an array or a deferred residual, each with an array
# or a pending merge as its input: a ring hop's (the array and one payload; divisor 1, 2, or 3 with the payload
# first), a co-located parameter server's (its worker's array among 3 payloads, divisor 4), a dedicated server's
# (4 payloads), and one of two arrays (left to NumPy)
MERGES = ["array", "hop merge", "hop merge / 2", "payload first / 3", "server merge / 4", "payloads only / 4",
          "two arrays"]
CASES = [("array", "none")] + [(x, a) for x in MERGES for a in ("array", "deferred")]

needs_kernel = pytest.mark.skipif(not sign_kernel.available(),
                                  reason="the C kernel is not built, the CPU lacks AVX2, or CASYNC_SIGN_KERNEL=0")


def test_the_kernel_is_built_on_x86_64_linux():
    """CI builds it (a C compiler is there): a missing kernel would pass every test below as skipped."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("the kernel is built and checked on x86-64 Linux")
    assert sign_kernel._kernel_sweep is not None, "primitives/codecs/_sign_sweep.c was not built (pip install -e .)"
    if not sign_kernel._cpu_runs_kernel():
        pytest.skip("this CPU lacks AVX2")


def _inputs(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    own = rng.standard_normal(n).astype(np.float32)
    own[::97] = -0.0  # encodes as + (a -0.0 is not < 0)
    corrected = rng.standard_normal(n).astype(np.float32)
    return dict(own=own, incoming=CODEC.encode(rng.standard_normal(n).astype(np.float32)),
                others=[CODEC.encode(rng.standard_normal(n).astype(np.float32)) for _ in range(3)],
                residual=(rng.standard_normal(n) * 0.1).astype(np.float32),
                deferred=DeferredResidual(corrected, CODEC, CODEC.encode(corrected)))


def _x(kind: str, d: dict, n: int):
    own, payloads = d["own"], [Deferred(CODEC, p, n) for p in [d["incoming"]] + d["others"]]
    return {"array": lambda: own,
            "hop merge": lambda: PendingMerge([own, payloads[0]], 1, n),
            "hop merge / 2": lambda: PendingMerge([own, payloads[0]], 2, n),
            "payload first / 3": lambda: PendingMerge([payloads[0], own], 3, n),
            "server merge / 4": lambda: PendingMerge([payloads[1], payloads[2], own, payloads[0]], 4, n),
            "payloads only / 4": lambda: PendingMerge(payloads, 4, n),
            "two arrays": lambda: PendingMerge([own, d["residual"]], 2, n)}[kind]()


def _sweep(monkeypatch, kernel: bool, x, addend, n: int):
    monkeypatch.setenv("CASYNC_SIGN_KERNEL", "1" if kernel else "0")
    out = None if addend is None else np.empty(n, np.float32)
    return CODEC._sweep(x, addend, out), out


def _assert_same(a, b):
    (pa, oa), (pb, ob) = a, b
    np.testing.assert_array_equal(pa["bits"], pb["bits"])
    assert pa["scale"].view(np.uint32)[0] == pb["scale"].view(np.uint32)[0], (pa["scale"], pb["scale"])
    if oa is not None:
        np.testing.assert_array_equal(oa.view(np.uint32), ob.view(np.uint32))


@needs_kernel
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("x_kind,addend_kind", CASES)
def test_kernel_sweep_equals_numpy_sweep(monkeypatch, n, x_kind, addend_kind):
    d = _inputs(n, seed=n)
    addend = {"none": None, "array": d["residual"], "deferred": d["deferred"]}[addend_kind]
    _assert_same(_sweep(monkeypatch, False, _x(x_kind, d, n), addend, n),
                 _sweep(monkeypatch, True, _x(x_kind, d, n), addend, n))


@needs_kernel
@pytest.mark.parametrize("x_kind,kernel_blocks", [("hop merge", [BLOCK, 192]), ("server merge / 4", [BLOCK, 192]),
                                                   ("payloads only / 4", [BLOCK, 192]), ("two arrays", [])])
def test_which_encodes_the_kernel_runs(monkeypatch, x_kind, kernel_blocks):
    """Ring hops' and servers' encodes go through the kernel, each block's first (size & ~63) elements (NumPy the
    last few); a merge of two arrays does not."""
    n = BLOCK + 200 + 5
    d = _inputs(n, seed=1)
    real, blocks = sign_kernel._kernel_sweep, []
    monkeypatch.setattr(sign_kernel, "_kernel_sweep", lambda *a: blocks.append(len(a[9]) * 8) or real(*a))
    monkeypatch.setenv("CASYNC_SIGN_KERNEL", "1")
    CODEC._sweep(_x(x_kind, d, n), d["deferred"], np.empty(n, np.float32))
    assert blocks == kernel_blocks


@needs_kernel
@pytest.mark.parametrize("case", ["nan in x", "inf in the residual", "nan scale of the incoming payload",
                                  "inf scale of the deferred residual"])
def test_nonfinite_inputs_give_the_same_bits_and_a_nonfinite_scale(monkeypatch, case):
    """A NaN/Inf input makes the scale NaN/Inf on both paths (what ``input_was_finite`` relies on); a payload with
    a non-finite scale is left to NumPy."""
    n = BLOCK + 77
    d = _inputs(n, seed=7)
    if case == "nan in x":
        d["own"][12345] = np.nan
    elif case == "inf in the residual":
        d["residual"][BLOCK + 3] = np.inf
    elif case == "nan scale of the incoming payload":
        d["incoming"] = {"bits": d["incoming"]["bits"], "scale": np.array([np.nan], np.float32)}
    else:
        p = d["deferred"].payload
        d["deferred"] = DeferredResidual(d["deferred"].corrected, CODEC,
                                         {"bits": p["bits"], "scale": np.array([np.inf], np.float32)})
    addend = d["residual"] if case == "inf in the residual" else d["deferred"]
    (pa, oa), (pb, ob) = (_sweep(monkeypatch, k, _x("hop merge", d, n), addend, n) for k in (False, True))
    np.testing.assert_array_equal(pa["bits"], pb["bits"])
    np.testing.assert_array_equal(oa, ob)  # NaNs compare equal here, whatever their payload bits
    assert not np.isfinite(pa["scale"][0]) and not np.isfinite(pb["scale"][0])
    assert not CODEC.input_was_finite(pb)


@needs_kernel
def test_a_malformed_payload_fails_as_on_the_numpy_path(monkeypatch):
    n = 4096
    d = _inputs(n, seed=3)
    bad = {"bits": d["incoming"]["bits"][:-1], "scale": d["incoming"]["scale"]}
    errors = []
    for kernel in (False, True):
        with pytest.raises(ValueError) as err:
            _sweep(monkeypatch, kernel, PendingMerge([d["own"], Deferred(CODEC, bad, n)], 1, n), d["residual"], n)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "onebit" in errors[1]


@needs_kernel
def test_the_kernel_refuses_blocks_it_cannot_sum_as_numpy_does():
    """Called directly with a block it does not take (fewer than 128 floats, or not a multiple of 64), it raises
    instead of returning other floats."""
    for n in (64, 130):
        x = np.ones(n, np.float32)
        with pytest.raises(ValueError, match="sign sweep kernel"):
            sign_kernel._kernel_sweep((x,), 0, (0.0,), 1.0, 0, b"", b"", 0.0, bytearray(0), bytearray(n // 8),
                                      np.empty(n // 64, np.float32), bytearray(0))


@needs_kernel
@pytest.mark.parametrize("n", [1, 7, 8, 13, 1000, BLOCK + 5, 2 * BLOCK + 8])
@pytest.mark.parametrize("kind", ["payloads only / 4", "server merge / 4", "payload first / 3", "hop merge",
                                  "one payload / 2", "two arrays"])
def test_kernel_merge_equals_numpy_merge(monkeypatch, n, kind):
    """An all-gather's (or a server's) merge of payloads decoded and summed in one pass: NumPy's floats."""
    d = _inputs(n, seed=n + 1)
    x = PendingMerge([Deferred(CODEC, d["incoming"], n)], 2, n) if kind == "one payload / 2" else _x(kind, d, n)
    got = []
    for kernel in ("0", "1"):
        monkeypatch.setenv("CASYNC_SIGN_KERNEL", kernel)
        got.append(run_merge(x.inputs, x.divisor))
    np.testing.assert_array_equal(got[0].view(np.uint32), got[1].view(np.uint32))


@needs_kernel
def test_an_all_gather_merge_runs_in_the_kernel(monkeypatch):
    n = BLOCK + 13
    d = _inputs(n, seed=2)
    real, blocks = sign_kernel._kernel_merge, []
    monkeypatch.setattr(sign_kernel, "_kernel_merge", lambda *a: blocks.append(len(a[4])) or real(*a))
    monkeypatch.setenv("CASYNC_SIGN_KERNEL", "1")
    run_merge(_x("payloads only / 4", d, n).inputs, 4)
    assert blocks == [BLOCK, 8]  # the last 5 floats: NumPy


@needs_kernel
def test_strided_outputs_are_left_to_numpy(monkeypatch):
    """A result or residual buffer that is not one contiguous float32 array is written by NumPy, correctly."""
    n = 4096
    d = _inputs(n, seed=4)
    monkeypatch.setenv("CASYNC_SIGN_KERNEL", "1")
    strided = np.empty(2 * n, np.float32)[::2]
    want = run_merge(_x("payloads only / 4", d, n).inputs, 4)
    got = run_merge(_x("payloads only / 4", d, n).inputs, 4, out=strided)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert sign_kernel.bind(d["own"], d["residual"], strided, OneBitCodec) is None


@needs_kernel
@pytest.mark.parametrize("n", [1, 7, 8, 13, 1000, sign_kernel.GIL_FREE_MIN - 3, sign_kernel.GIL_FREE_MIN + 8])
def test_small_decodes_in_the_kernel_equal_the_tables(monkeypatch, n):
    """A decode under GIL_FREE_MIN elements runs in the kernel (no lookup table to build), whole or a block of it,
    with the same floats as the table's, signed zeros and a zero scale included; a larger one, and a strided
    output, through the table (the block of the largest size is small enough for the kernel)."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    payloads = [CODEC.encode(x), CODEC.encode(np.zeros(n, np.float32)), CODEC.encode(-np.zeros(n, np.float32))]
    start = 8 * (n // 16)  # a block from a byte boundary to the end
    calls = []
    real = sign_kernel._kernel_merge
    monkeypatch.setattr(sign_kernel, "_kernel_merge", lambda *a: calls.append(len(a[4])) or real(*a))
    for payload in payloads:
        got = []
        for kernel in ("0", "1"):
            monkeypatch.setenv("CASYNC_SIGN_KERNEL", kernel)
            got.append((CODEC.decode(payload, n), CODEC.decode_block(payload, n, start, n, np.empty(n - start, np.float32)),
                        CODEC.decode_into(payload, n, np.empty(2 * n, np.float32)[::2])))
        for a, b in zip(*got):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert calls == [m & ~7 for m in (n, n - start) if 8 <= m < sign_kernel.GIL_FREE_MIN] * len(payloads)
