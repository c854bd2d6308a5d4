"""Side by side on this host: onebit's ops with the C kernel and without (alternating), and the 'deferred'
cost of every block-decoding codec beside its decode, at the packaged profile's sizes and repeats."""
import json, os, sys
from casync.sim.profiler import profile_codecs, DEFAULT_SIZES
out = {"onebit": {"1": [], "0": []}, "blocks": None}
for _ in range(2):
    for K in ("1", "0"):
        os.environ["CASYNC_SIGN_KERNEL"] = K
        c = profile_codecs(["onebit"], DEFAULT_SIZES, 15)["onebit"]
        out["onebit"][K].append({op: [lc.a, lc.b] for op, lc in c.items()})
        print(K, {op: round(lc(2**22) * 1e3, 3) for op, lc in c.items()}, flush=True)
os.environ["CASYNC_SIGN_KERNEL"] = "1"
c = profile_codecs(["fp16", "terngrad", "tbq"], DEFAULT_SIZES, 15)
out["blocks"] = {k: {op: [lc.a, lc.b] for op, lc in v.items()} for k, v in c.items()}
for k, v in c.items():
    print(k, {op: round(lc(2**22) * 1e3, 3) for op, lc in v.items()}, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
