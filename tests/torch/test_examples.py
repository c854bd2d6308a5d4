"""The examples as users run them: ``torchrun`` with 2 processes, and Ray Train on an embedded local Ray."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "")
                                                                      .split(os.pathsep) if p]), OMP_NUM_THREADS="1")


def _torchrun(*args: str) -> str:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    run = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2",
                          str(ROOT / "examples" / "torchrun_ddp.py"), *args], capture_output=True, text=True,
                         env=_env(), cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_torchrun_example_trains_and_resumes_exactly(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    straight = _torchrun("--codec", "onebit", "--steps", "40", "--checkpoint", ckpt, "--save-at", "20")
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", straight)]
    assert losses[-1] < losses[0], straight
    assert f"saved {ckpt} after step 20" in straight
    sent, raw = (int(x.replace(",", "")) for x in re.search(r"rank 0: ([\d,]+) of ([\d,]+) raw", straight).groups())
    assert 0 < sent < raw / 10  # onebit on the wire
    resumed = _torchrun("--codec", "onebit", "--steps", "40", "--checkpoint", ckpt, "--resume")
    crc = re.compile(r"parameters crc ([0-9a-f]{8})")
    assert crc.search(resumed).group(1) == crc.search(straight).group(1), resumed
    # a checkpoint already at --steps: nothing left to train, the script still ends with its summary
    done = _torchrun("--codec", "onebit", "--steps", "20", "--checkpoint", ckpt, "--resume")
    assert "0 steps in" in done and "last loss none" in done, done


def test_torchrun_example_plans_per_ddp_bucket_with_auto():
    """``--strategy auto --codec auto``: the planner chooses per DDP bucket for the cluster given (2 nodes at
    100 Mbit here) and DDP's timing; on such links it compresses, and the script prints its choice.  (At 1 Gbit the
    choice for this small model is close and follows the measured backward: once, with another pytest process
    beside it, the planner left most of the bytes uncompressed.)"""
    out = _torchrun("--strategy", "auto", "--codec", "auto", "--nodes", "2", "--gbps", "0.1", "--steps", "30")
    assert "SyncPlan: 6 tensors in 2 buckets" in out, out  # DDP's two buckets (bucket_cap_mb=0.25)
    sent, raw = (int(x.replace(",", "")) for x in re.search(r"rank 0: ([\d,]+) of ([\d,]+) raw", out).groups())
    assert 0 < sent < raw / 10
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]
    assert losses[-1] < losses[0], out


DRIVER = """
import glob, json, runpy, sys
example = runpy.run_path(sys.argv[1], run_name="ray_train_example")  # functions pickled by value for the workers
# relative paths, as a user types them (run in the test's directory): Ray Train needs them made absolute
first = example["main"](["--epochs", "2", "--steps", "8", "--storage", "a"])
epoch1 = sorted(glob.glob("a/casync_ray_train/checkpoint_*"))[0]
second = example["main"](["--epochs", "2", "--steps", "8", "--storage", "b", "--resume", epoch1])
import ray
print("GCS", ray.get_runtime_context().gcs_address)
print("RESULT", json.dumps([first["metrics"], second["metrics"]]))
"""


@pytest.mark.slow
@pytest.mark.ray
def test_ray_train_example_runs_and_resumes_exactly(tmp_path):
    # Ray Train's controller notices that the workers finished at its next health check (every 2 s by default):
    # polled every 0.2 s here, each of the two runs ends as soon as its workers do (a hanging poll is still
    # only an error after RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S, 10 minutes)
    env = dict(_env(), RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2")
    run = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "examples" / "ray_train.py")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=540)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    import json

    first, second = json.loads(run.stdout.split("RESULT", 1)[1])
    assert first["epoch"] == second["epoch"] == 2
    assert first["crc"] == second["crc"]  # resumed from epoch 1's checkpoint: the same parameters, bit for bit
    assert 0 < first["sent_bytes"]
    assert "GCS 127.0.0.1:" in run.stdout  # the embedded Ray is bound to loopback, as RayEngine's (docs/cluster.md)


SPAWNED = r"""
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp
import casync.torch as ct

def main(rank, world, rendezvous):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
    state = ct.CasyncState(strategy="ps", codec="onebit")
    ddp.register_comm_hook(state, ct.comm_hook)
    for step in range(4):
        torch.manual_seed(step * world + rank)
        ddp(torch.randn(16, 64)).square().mean().backward()
    sys.stdout.write(f"rank {rank} steps {state.iter} ok\n")  # one write: the ranks share the pipe
    sys.stdout.flush()
    state.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(2, sys.argv[1]), nprocs=2)
"""


def test_ranks_started_by_mp_spawn_exit_cleanly(tmp_path):
    """The DDP tutorial's way to start ranks: they share one resource tracker, which must not be told twice
    about casync's shared-memory arenas (it printed a KeyError traceback per arena at exit).  The ranks meet
    through a file (the tutorial's other init method): no port to race for."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "rendezvous")], capture_output=True, text=True,
                         env=_env(), cwd=ROOT, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d) steps 4 ok", run.stdout)) == ["0", "1"], run.stdout
    assert "Traceback" not in run.stderr and "leaked" not in run.stderr, run.stderr[-3000:]
