"""Where a DDP rank's CPU goes with casync's comm hook, beside DDP without communication and DDP's allreduce.

    python benchmarks/hook_cpu.py [--model resnet50] [--workers 4] [--variants ddp-nocomm,ddp,ring/onebit]
                                  [--compute-threads 1] [--iters 12] [--out DIR]
    python benchmarks/hook_cpu.py --task image [--variants nocomm,allreduce,allgather/topk1%+dgc] ...

Ranks are gloo processes on this machine running the benchmark's gradient model under
``DistributedDataParallel`` (25 MiB buckets), as ``casync bench``'s DDP rows do; a variant is a baseline
name or a hook row's ``strategy/codec``.  Per variant, after the warm-up iterations, each timed iteration's
``backward()`` (every bucket's hook and result included) is measured by the rank's process CPU and by each of
its threads' CPU (``/proc/self/task``, named from ``threading.enumerate()``; threads that ended within the
iteration, such as casync's per-step thread, count as *ended*), and for hook rows by the ops' own CPU
(``CasyncState.timeline()``).  The process CPU beyond the no-communication row is what the sync itself costs
a rank; set beside RayEngine's per-actor sync CPU (``benchmarks/sync_window_cpu.py``), it shows whether the
hook does more work than the engine or only has less room to do it in.

With ``--task`` the ranks train that task's model instead (``casync tta``'s model, batches, optimizer and DDP set-up,
``casync.bench.tta.rank.build``), and a variant is a time-to-accuracy configuration (``casync tta --list-configs``,
its keepers and optimizer groups included).  Each timed step is split by process CPU into its data, forward,
backward (hook included), optimizer and the rest; and the hook's own phases (DGC's clipping and momentum, masking,
the hand-over of each bucket, the results written back, the runner's begin/run/commit) by the CPU of the thread
that ran them (:class:`Phases`: the functions are wrapped while the variant runs; nested ones are counted in both).
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


#: the hook's phases the task mode times, as (module, attribute, label): functions of casync's hook, DGC's keepers
#: and the runner, each timed by the CPU of the thread it runs on (a nested one is counted in its caller as well)
PHASES = (
    ("casync.torch.hook_keepers", "HookKeepers.__call__", "keepers: hold buckets, apply, dispatch"),
    ("casync.torch.keepers", "LocalKeepers.apply", "keepers: clip + momentum"),
    ("casync.torch.keepers", "clip_by_global_norm", "keepers: clip"),
    ("casync.torch.keepers", "LocalKeepers.finish", "keepers: finish (masking)"),
    ("casync.torch.hook", "HookSession._compressed", "hook: hand a bucket over"),
    ("casync.torch.hook", "HookSession._result", "hook: result into DDP's bucket"),
    ("casync.torch.runner", "PlanRunner.begin", "runner: begin"),
    ("casync.torch.runner", "PlanRunner.run", "runner: run (the ops)"),
    ("casync.torch.runner", "PlanRunner.commit", "runner: commit"),
)


class Phases:
    """Thread CPU seconds spent in each of ``phases`` while :meth:`wrapped` is active, summed by label."""

    def __init__(self, phases: tuple[tuple[str, str, str], ...] = PHASES):
        self.phases = phases
        self.spent: dict[str, float] = {}
        self._lock = threading.Lock()

    def _wrap(self, fn: Any, label: str) -> Any:
        import functools

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - t0
                with self._lock:
                    self.spent[label] = self.spent.get(label, 0.0) + spent
        return timed

    def wrapped(self) -> Any:
        """A context manager: every phase's function replaced by a timed one inside it."""
        import contextlib
        import importlib

        @contextlib.contextmanager
        def active() -> Any:
            undo = []
            try:
                for module, attr, label in self.phases:
                    owner: Any = importlib.import_module(module)
                    *path, name = attr.split(".")
                    for part in path:
                        owner = getattr(owner, part)
                    original = owner.__dict__[name]
                    setattr(owner, name, self._wrap(original, label))
                    undo.append((owner, name, original))
                yield self
            finally:
                for owner, name, original in reversed(undo):
                    setattr(owner, name, original)
        return active()

    def take(self) -> dict[str, float]:
        """The seconds counted since the last take, and start again."""
        with self._lock:
            spent, self.spent = self.spent, {}
        return spent


def _add(total: dict[str, float], part: dict[str, float], scale: float = 1.0) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + value * scale


def run_task_variant(name: str, task: Any, data: Any, iters: int, compute_threads: int, rank: int, world: int
                     ) -> dict[str, Any]:
    """One tta configuration trained for ``WARMUP + iters`` steps; per timed step (means), the process CPU of each
    part of the step, each thread kind's CPU, the hook's phases and its ops' CPU by op."""
    import torch
    import torch.distributed as dist

    from casync.bench.tta.configs import CONFIGS
    from casync.bench.tta.rank import build

    config = CONFIGS[name]
    lr = task.defaults["lr"]
    model = task.model(data, 0)
    spec = {"steps": WARMUP + iters, "compute_threads": compute_threads}
    net, opt, holder = build(config, task, model, lr, 0, spec)
    state = holder if hasattr(holder, "timeline") else None
    batches = task.batches(data, rank, world, task.defaults["batch_size"], 0)
    parts = ("data", "forward", "backward", "optimizer")
    cpu = {p: 0.0 for p in parts}
    process, wall, threads, ops = [], [], {}, {}
    phases = Phases()
    with phases.wrapped():
        for i in range(WARMUP + iters):
            dist.barrier()
            phases.take()
            k0, t0, c0 = thread_cpu(), time.perf_counter(), time.process_time()
            inputs, targets = next(batches)
            c1 = time.process_time()
            opt.zero_grad(set_to_none=False)
            loss = task.loss(net, inputs, targets)
            c2 = time.process_time()
            loss.backward()
            c3 = time.process_time()
            opt.step()
            c4, t1, k1 = time.process_time(), time.perf_counter(), thread_cpu()
            spent = phases.take()
            if i < WARMUP:
                continue
            for part, took in zip(parts, (c1 - c0, c2 - c1, c3 - c2, c4 - c3)):
                cpu[part] += took / iters
            process.append(c4 - c0)
            wall.append(t1 - t0)
            names = {t.native_id: thread_kind(t.name) for t in threading.enumerate()}
            _add(threads, {names.get(tid, "native (torch, gloo)"): c - k0.get(tid, 0.0) for tid, c in k1.items()},
                 1 / iters)
            _add(threads, {"ended": (c4 - c0) - sum(k1[t] - k0.get(t, 0.0) for t in k1)}, 1 / iters)
            _add(cpu, {f"phase {k}": v for k, v in spent.items()}, 1 / iters)
            if state is not None:
                step_ops: dict[str, float] = {}
                for r in state.timeline():
                    if r["op"] != "backward" and r["step"] == state.iter - 1:
                        _add(step_ops, {r["op"]: r["cpu"] or 0.0})
                _add(ops, step_ops, 1 / iters)
    session = getattr(state, "session", None)
    stats = {k: session.stats.get(k) for k in ("in_place", "as_planned", "lent")} if session is not None else {}
    for closing in {id(x): x for x in (holder, opt)}.values():
        if hasattr(closing, "close"):
            closing.close()
    return {"process_s": statistics.mean(process), "wall_s": statistics.median(wall),
            "ops_s": sum(ops.values()) if state is not None else None, "threads_s": threads,
            "parts_s": cpu, "op_s": ops, "buckets": stats}


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
    if args.task is not None:
        from casync.tasks import get_task

        task = get_task(args.task)
        data = task.load(args.data)
        mine = {v: run_task_variant(v, task, data, args.iters, args.compute_threads, rank, world)
                for v in args.variants.split(",")}
    else:
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
        if "buckets" in gathered[0][variant]:  # how the hook's last step handed DDP's buckets over (rank 0's)
            rows[-1]["buckets"] = gathered[0][variant]["buckets"]
        for key in ("parts_s", "op_s"):  # the task mode's split of a step, and its ops' CPU by op
            if key in gathered[0][variant]:
                names = {k for g in gathered for k in g[variant][key]}
                rows[-1][key[:-2] + "_ms"] = {k: round(statistics.mean(g[variant][key].get(k, 0.0) for g in gathered)
                                                       * 1e3, 2) for k in sorted(names)}
    floor = next((r["cpu_ms"] for r in rows if r["variant"] in ("ddp-nocomm", "nocomm")), None)
    for r in rows:
        r["beyond_floor_ms"] = round(r["cpu_ms"] - floor, 1) if floor is not None else None
    return rows


def split_table(rows: list[dict[str, Any]]) -> str:
    """The task mode's per-step split (ms of CPU per rank and step): one row per part, phase or op, one column per
    variant."""
    keys = sorted({k for r in rows for k in r.get("parts_ms", {})}, key=lambda k: (k.startswith("phase"), k))
    ops = sorted({k for r in rows for k in r.get("op_ms", {})})
    body = [[k] + [r["parts_ms"].get(k, "") for r in rows] for k in keys]
    body += [[f"op {k}"] + [r.get("op_ms", {}).get(k, "") for r in rows] for k in ops]
    return markdown_table(["CPU ms per rank and step"] + [r["variant"] for r in rows], body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--variants", default=None,
                        help="baselines (ddp-nocomm, ddp) and hook rows (strategy/codec), comma-separated (default "
                             "ddp-nocomm,ddp,ring/onebit); with --task, tta configurations (default "
                             "nocomm,allreduce,allgather/topk1%%+dgc)")
    parser.add_argument("--task", default=None, help="train this task's model (casync tta's set-up) instead")
    parser.add_argument("--data", default=None, help="with --task: its data set or corpus (default: the task's)")
    parser.add_argument("--compute-threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--out", default=None, help="write hook_cpu.md/.json there")
    args = parser.parse_args(argv)
    if args.variants is None:
        args.variants = "nocomm,allreduce,allgather/topk1%+dgc" if args.task else "ddp-nocomm,ddp,ring/onebit"
    if args.task is not None:
        from casync.bench.tta.configs import resolve

        resolve(args.variants.split(","), args.task)  # an unknown or unavailable one, before any rank starts

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
        if args.task is not None:
            text += "\n" + split_table(rows) + "\n"
        write_results(args.out, "hook_cpu", text, dict(args=vars(args), rows=rows))


if __name__ == "__main__":
    main()
