"""The cores a backward pass keeps busy while it runs: what a DDP rank's backward takes from the cores a sync shares.

The calibration stores it in the profile (``RuntimeCosts.backward_cores``); where a sync overlaps a backward (its
buckets ready one after another) the simulator and the planner charge each rank's backward its share of the node's
cores (``casync.sim.costmodel.Profile.backward_share``).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys

#: the backward measured by :func:`measure_backward_cores`: a small convolutional network's, as the bench's ranks run
#: theirs (one intra-op thread: ``casync.bench.baselines``, ``casync.torch.engine``)
_BACKWARD_PROBE = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1),
                          torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(32 * 32 * 32, 10))
x = torch.randn(16, 3, 32, 32)
def step():
    net.zero_grad(set_to_none=True)
    loss = net(x).square().mean()
    wall, cpu = time.perf_counter(), time.process_time()
    loss.backward()
    return time.perf_counter() - wall, time.process_time() - cpu
step()
wall = cpu = 0.0
while wall < float(sys.argv[2]):
    w, c = step()
    wall, cpu = wall + w, cpu + c
print(cpu / wall)
"""


def measure_backward_cores(seconds: float = 0.5, threads: int = 1, timeout_s: float = 60.0) -> float:
    """Cores a backward pass keeps busy while it runs: its process's CPU seconds over the wall seconds of backward
    passes of a small convolutional network with ``threads`` intra-op threads (what the bench's DDP ranks run),
    about ``seconds`` of them, in a child process (torch is never imported here).  0.0 where torch is not
    installed: the simulator then charges no backward.  On a loaded machine it comes out below the threads: the
    backward gets less of the cores, as it would beside the sync."""
    if importlib.util.find_spec("torch") is None:
        return 0.0
    done = subprocess.run([sys.executable, "-c", _BACKWARD_PROBE, str(threads), str(seconds)], capture_output=True,
                          text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"measuring the backward's cores failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-500:]}")
    return max(0.0, float(done.stdout.strip().splitlines()[-1]))



__all__ = ["measure_backward_cores"]
