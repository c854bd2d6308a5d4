"""ns per float of one in-cache np.add pass, by array size, with P processes at once."""
import sys, time, multiprocessing as mp
import numpy as np
def run(n, q):
    a = np.ones(n, np.float32); b = np.ones(n, np.float32); c = np.empty(n, np.float32)
    reps = max(1, (64 << 20) // n)
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps): np.add(a, b, out=c)
        best = min(best, (time.perf_counter() - t) / reps / n)
    q.put(best)
if __name__ == "__main__":
    procs = int(sys.argv[1])
    for n in (16384, 65536, 262144, 1048576, 4194304):
        q = mp.Queue(); ps = [mp.Process(target=run, args=(n, q)) for _ in range(procs)]
        [p.start() for p in ps]; [p.join() for p in ps]
        print(f"add n={n:>8} ({4*n>>10} KiB/array) x{procs}: {max(q.get() for _ in ps)*1e9:.3f} ns/float", flush=True)
