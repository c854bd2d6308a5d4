"""Where a DDP rank's CPU goes with casync's comm hook, beside DDP without communication and DDP's allreduce.

    python benchmarks/hook_cpu.py [--model resnet50] [--workers 4] [--variants ddp-nocomm,ddp,ring/onebit]
                                  [--compute-threads 1] [--iters 12] [--out DIR]

Ranks are gloo processes on this machine running the benchmark's gradient model under
``DistributedDataParallel`` (25 MiB buckets), as ``casync bench``'s DDP rows do; a variant is a baseline
name or a hook row's ``strategy/codec``.  Per variant, after the warm-up iterations, each timed iteration's
``backward()`` (every bucket's hook and result included) is measured by the rank's process CPU and by each of
its threads' CPU (``/proc/self/task``, named from ``threading.enumerate()``; threads that ended within the
iteration, such as casync's per-step thread, count as *ended*), and for hook rows by the ops' own CPU
(``CasyncState.timeline()``).  The process CPU beyond the no-communication row is what the sync itself costs
a rank; set beside RayEngine's per-actor sync CPU (``benchmarks/sync_window_cpu.py``), it shows whether the
hook does more work than the engine or only has less room to do it in.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from casync.table import markdown_table  # noqa: E402
from result_files import write_results  # noqa: E402

WARMUP = 13  # the hook's uncompressed iterations, DDP's rebuild, and the settling the bench gives DDP rows


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each of this process's threads, by native id."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_kind(name: str) -> str:
    """A thread's name without its peer or step (``casync-send-worker:0->worker:1`` -> ``casync-send``)."""
    return "-".join(name.split("-")[:2]) if name.startswith("casync-") else name


def run_variant(variant: str, shapes: list, flat: Any, iters: int, compute_threads: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from casync.bench.baselines import NO_COMMUNICATION, _gradient_model, _no_communication
    from casync.bench.hooks import casync_hook, hook_variant

    views, offset = [], 0
    for _, shape in shapes:
        views.append((offset, offset + math.prod(shape), shape))
        offset += math.prod(shape)
    model = _gradient_model(shapes)
    grads = [flat[a:b].view(shape) for a, b, shape in reversed(views)]
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25, gradient_as_bucket_view=True)
    state, hook = None, None
    if variant == NO_COMMUNICATION:
        hook = _no_communication
    elif variant == "ddp":
        hook = default_hooks.allreduce_hook
    else:
        state, hook = casync_hook(hook_variant(*variant.split("/", 1)), compute_threads)

    def registered(st, bucket, inner=hook):  # unannotated: DDP refuses a bucket annotated other than GradBucket
        return inner(st, bucket)

    ddp.register_comm_hook(state, registered)
    process, wall, ops, threads = [], [], [], {}
    for i in range(WARMUP + iters):
        ddp.zero_grad(set_to_none=False)
        dist.barrier()
        c0, t0, k0 = time.process_time(), time.perf_counter(), thread_cpu()
        ddp(grads).backward()
        k1, t1, c1 = thread_cpu(), time.perf_counter(), time.process_time()
        if i < WARMUP:
            continue
        process.append(c1 - c0)
        wall.append(t1 - t0)
        names = {t.native_id: thread_kind(t.name) for t in threading.enumerate()}
        for tid, cpu in k1.items():
            kind = names.get(tid, "native (torch, gloo)")
            threads[kind] = threads.get(kind, 0.0) + (cpu - k0.get(tid, 0.0)) / iters
        threads["ended"] = threads.get("ended", 0.0) + ((c1 - c0) - sum(k1[t] - k0.get(t, 0.0) for t in k1)) / iters
        if state is not None:
            ops.append(sum(r["cpu"] or 0.0 for r in state.timeline() if r["op"] != "backward"))
    if state is not None:
        state.close()  # casync's groups and threads, before the next variant's
    return {"process_s": statistics.median(process), "wall_s": statistics.median(wall),
            "ops_s": statistics.median(ops) if ops else None, "threads_s": threads}


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from casync.bench.ranks import leave_without_teardown
    from casync.datasets.gradients import model_shapes, worker_flat
    from casync.engines.memory import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    flat = torch.from_numpy(worker_flat(args.model, rank, 0))
    mine = {v: run_variant(v, model_shapes(args.model), flat, args.iters, args.compute_threads)
            for v in args.variants.split(",")}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        queue.put(gathered)  # a SimpleQueue writes to its pipe at once: nothing is left to flush at exit
    dist.destroy_process_group()
    leave_without_teardown()  # as the bench's ranks (6 of 20 runs aborted at exit without it)


def summarize(gathered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant, the mean over ranks; the process CPU beyond the no-communication variant where it ran."""
    rows = []
    for variant in gathered[0]:
        mean = {k: statistics.mean(g[variant][k] for g in gathered) for k in ("process_s", "wall_s")}
        kinds = {k for g in gathered for k in g[variant]["threads_s"]}
        threads = {k: statistics.mean(g[variant]["threads_s"].get(k, 0.0) for g in gathered) for k in kinds}
        ops = [g[variant]["ops_s"] for g in gathered if g[variant]["ops_s"] is not None]
        rows.append(dict(variant=variant, wall_ms=round(mean["wall_s"] * 1e3, 1),
                         cpu_ms=round(mean["process_s"] * 1e3, 1),
                         ops_cpu_ms=round(statistics.mean(ops) * 1e3, 1) if ops else None,
                         threads_ms={k: round(v * 1e3, 1) for k, v in sorted(threads.items(), key=lambda kv: -kv[1])}))
    floor = next((r["cpu_ms"] for r in rows if r["variant"] == "ddp-nocomm"), None)
    for r in rows:
        r["beyond_floor_ms"] = round(r["cpu_ms"] - floor, 1) if floor is not None else None
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--variants", default="ddp-nocomm,ddp,ring/onebit",
                        help="baselines (ddp-nocomm, ddp) and hook rows (strategy/codec), comma-separated")
    parser.add_argument("--compute-threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--out", default=None, help="write hook_cpu.md/.json there")
    args = parser.parse_args(argv)

    import torch.multiprocessing as mp

    from casync.bench.setup import local_setup

    port = local_setup().launcher().port()  # a free port on loopback, as casync bench's own ranks get one
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(args.workers, port, args, queue), nprocs=args.workers)
    rows = summarize(queue.get())
    for row in rows:
        print(row, flush=True)
    if args.out:
        columns = ["variant", "wall_ms", "cpu_ms", "beyond_floor_ms", "ops_cpu_ms", "threads_ms"]
        text = (f"# A DDP rank's CPU per iteration\n\n```\npython benchmarks/hook_cpu.py "
                f"{' '.join(argv or sys.argv[1:])}\n```\n\n"
                + markdown_table(columns, [[r[c] if r[c] is not None else "" for c in columns] for r in rows]) + "\n")
        write_results(args.out, "hook_cpu", text, dict(args=vars(args), rows=rows))


if __name__ == "__main__":
    main()
