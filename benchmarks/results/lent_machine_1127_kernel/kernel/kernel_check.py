import os, time, numpy as np
from primitives.codecs.sign import OneBitCodec
from primitives.codecs import sign_kernel
from primitives.codecs.base import BLOCK
from primitives.codecs.residual import DeferredResidual
from primitives.merge import PendingMerge, Deferred
print("kernel available", sign_kernel.available())
codec = OneBitCodec()
def run(on, mk, addend, n):
    os.environ["CASYNC_SIGN_KERNEL"] = "1" if on else "0"
    o = np.empty(n, np.float32) if addend is not None else None
    return codec._sweep(mk(), addend, o), o
rng = np.random.default_rng(0); bad = 0; cases = 0
for n in [1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 191, 192, 1000, 4096, 4103, 65536 + 5, 600 * 64, BLOCK - 8, BLOCK, BLOCK + 13, BLOCK + 200, 2 * BLOCK + 8, 3 * BLOCK + 999]:
    own = rng.standard_normal(n).astype(np.float32); own[::97] = -0.0
    inc = codec.encode(rng.standard_normal(n).astype(np.float32))
    r = rng.standard_normal(n).astype(np.float32) * 0.1
    cp = rng.standard_normal(n).astype(np.float32)
    dres = DeferredResidual(cp, codec, codec.encode(cp))
    for xk in ("array", "merge1", "merge2", "merge3r"):
        for ak in ("none", "array", "deferred"):
            if ak == "none" and xk != "array": continue
            def mk():
                if xk == "array": return own
                if xk == "merge3r": return PendingMerge([Deferred(codec, inc, n), own], 3, n)
                return PendingMerge([own, Deferred(codec, inc, n)], 1 if xk == "merge1" else 2, n)
            addend = None if ak == "none" else r if ak == "array" else dres
            (p1, o1), (p2, o2) = run(False, mk, addend, n), run(True, mk, addend, n)
            cases += 1
            same = np.array_equal(p1["bits"], p2["bits"]) and p1["scale"].view(np.uint32)[0] == p2["scale"].view(np.uint32)[0]
            if o1 is not None: same = same and np.array_equal(o1.view(np.uint32), o2.view(np.uint32))
            if not same: bad += 1; print("MISMATCH", n, xk, ak, p1["scale"], p2["scale"])
print("cases", cases, "mismatches", bad)
n = 6_400_000
own = rng.standard_normal(n).astype(np.float32); inc = codec.encode(rng.standard_normal(n).astype(np.float32))
cp = rng.standard_normal(n).astype(np.float32); dres = DeferredResidual(cp, codec, codec.encode(cp))
for on in (False, True, False, True):
    f = lambda: run(on, lambda: PendingMerge([own, Deferred(codec, inc, n)], 1, n), dres, n)
    f(); best = 1e9
    for _ in range(7):
        t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t)
    print("kernel" if on else "numpy ", f"{best*1e3:.2f} ms  {best/n*1e9:.3f} ns/float")
