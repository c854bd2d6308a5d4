"""ns per float of a ring hop's onebit encode (pending merge + deferred residual) by BLOCK size.
Usage: python blockbench.py N THREADS_PER_PROC PROCS BLOCKS..."""
import os, sys, time, threading, multiprocessing as mp
import numpy as np

def run(block, n, threads, q):
    import primitives.codecs.base as base, primitives.codecs.sign as sign, primitives.codecs.residual as res, primitives.merge as merge, primitives.codecs.dense as dense
    for mod in (base, sign, res, merge, dense):
        mod.BLOCK = block
    from primitives.merge import PendingMerge, Deferred
    codec = sign.OneBitCodec()
    def work(out):
        rng = np.random.default_rng(1)
        g = rng.standard_normal(n).astype(np.float32)
        other = codec.encode(rng.standard_normal(n).astype(np.float32))
        # a residual deferred from a previous encode
        _, resid = codec.encode_feedback_deferred(g, np.zeros(n, np.float32), out=np.empty(n, np.float32))
        bufs = [np.empty(n, np.float32), np.empty(n, np.float32)]
        ts = []
        for it in range(8):
            pm = PendingMerge([g, Deferred(codec, other, n)], 1, n)
            t = time.perf_counter()
            payload, resid = codec.encode_feedback_deferred(pm, resid, out=bufs[it % 2])
            ts.append(time.perf_counter() - t)
        out.append(min(ts[2:]))
    outs = []
    th = [threading.Thread(target=work, args=(outs,)) for _ in range(threads)]
    [t.start() for t in th]; [t.join() for t in th]
    q.put(max(outs))

if __name__ == "__main__":
    n, threads, procs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    for block in map(int, sys.argv[4:]):
        q = mp.Queue()
        ps = [mp.Process(target=run, args=(block, n, threads, q)) for _ in range(procs)]
        [p.start() for p in ps]; [p.join() for p in ps]
        worst = max(q.get() for _ in ps)
        print(f"BLOCK {block:>7}: {worst*1e3:7.2f} ms  {worst/n*1e9:5.2f} ns/float  ({procs}x{threads})", flush=True)
