"""Per-kernel timings of the codecs' NumPy passes (warm, median of 30), to compare two machines' CPUs.

    python benchmarks/results/gpu_machine_16cores/kernels.py   (from the repository root)
"""
import sys, time, platform
import numpy as np
sys.path.insert(0, ".")
from primitives.codecs.sign import OneBitCodec, _table
from primitives.codecs.base import BLOCK, block_sum, expand_packed
from primitives.codecs.sparse import RandomKCodec

def t(fn, reps=30):
    fn(); ts = []
    for _ in range(reps):
        a = time.perf_counter(); fn(); ts.append(time.perf_counter() - a)
    return np.median(ts) * 1e3

n = 1054211
rng = np.random.default_rng(0)
x = rng.standard_normal(n, dtype=np.float32); r = (rng.standard_normal(n, dtype=np.float32) * 0.1)
o = np.empty(n, np.float32); b = np.empty(n, np.bool_); bits = np.packbits(x < 0)
xb, ob, bb = x[:BLOCK], o[:BLOCK], b[:BLOCK]
c = OneBitCodec(); p = c.encode(x); lut = _table(np.float32(0.5))
rk = RandomKCodec(ratio=0.01); prk = rk.encode(x, seed=3)
rows = {
    "add (full)": lambda: np.add(x, r, out=o),
    "less->bool (full)": lambda: np.less(x, 0, out=b),
    "packbits (full)": lambda: np.packbits(b),
    "abs (full)": lambda: np.abs(x, out=o),
    "block_sum (full)": lambda: block_sum(x),
    "np.sum f32 (full)": lambda: x.sum(),
    "subtract (full)": lambda: np.subtract(x, r, out=o),
    "copyto (full)": lambda: np.copyto(o, x),
    "expand_packed (full)": lambda: expand_packed(lut, bits, n, out=o),
    "onebit encode": lambda: c.encode(x),
    "onebit encode_feedback": lambda: c.encode_feedback(x, r, 0, o),
    "onebit decode_into": lambda: c.decode_into(p, n, o),
    "randomk encode (1%)": lambda: rk.encode(x, seed=3),
    "randomk decode (1%)": lambda: rk.decode(prk, n),
    "less->bool (block)": lambda: [np.less(x[s:s + BLOCK], 0, out=b[:min(BLOCK, n - s)]) for s in range(0, n, BLOCK)],
    "packbits (block)": lambda: [np.packbits(b[s:s + BLOCK]) for s in range(0, n, BLOCK)],
}
print(platform.processor() or platform.machine(), "numpy", np.__version__)
try:
    from numpy._core._multiarray_umath import __cpu_features__ as f
    print("cpu features:", " ".join(k for k in ("AVX2", "FMA3", "AVX512F", "AVX512BW", "AVX512_SKX", "AVX512_ICL") if f.get(k)))
except Exception as e:
    print("cpu features: ?", e)
for name, fn in rows.items():
    print(f"{name:26s} {t(fn):7.3f} ms")
