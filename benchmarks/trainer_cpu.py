"""Where a Trainer step's CPU goes: each worker's threads, the other processes, and the machine's cores.

    python benchmarks/trainer_cpu.py [--model mlp] [--workers 4] [--strategy ring] [--codec onebit]
                                     [--warmup 20] [--steps 60] [--out DIR]

The Trainer of ``casync train`` (its defaults: the digits MLP, 32 samples per worker, SGD) runs ``--warmup``
steps, then ``--steps`` more while ``/proc`` is read before and after: every thread of every worker actor,
named from the actor's own ``threading.enumerate()`` (Ray's call thread, where ``train_step`` and ``apply`` run,
found by ``call_thread``), every process that used CPU, and the machine's counters.  Per worker and step this
shows how much of a step's CPU is the model's forward, backward and update, how much the sync's ops, and how
much the data plane's threads; against the cores, whether the step is CPU-bound (all processes' CPU per step /
cores, beside the measured step).  Linux only (``/proc``).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

from result_files import write_results
from sync_window_cpu import STAT_FIELDS, TICK, machine, process_label, thread_role, ticks

from casync.table import markdown_table

CALL_THREAD = "Ray's call thread (train_step: batch, forward, backward, gradient copies; apply: optimizer step)"
ROLES = {"casync-sync-#": "sync thread (the plan's encodes, decodes, merges)",
         "casync-send-#->#": "sender lanes (payloads into the peers' slots)",
         "casync-recv-#<-#": "receiver lanes", "casync-socket-#<-#": "socket readers"}
OTHER = "other threads (Ray's, PyTorch's; named by neither)"
GROUP = "Ray's call threads of the sync group (waiting for a step's results)"


def snapshot(pids: list[int]) -> tuple[list[int], dict[int, int], dict[tuple[int, int], int]]:
    """The machine's counters, every process's CPU ticks, and the given processes' threads' ticks."""
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (value := ticks(f"/proc/{name}/stat")):
            procs[int(name)] = value
    threads = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            threads[(pid, int(tid))] = ticks(f"/proc/{pid}/task/{tid}/stat")
    return machine(), procs, threads


def thread_label(name: str | None, is_call_thread: bool) -> str:
    """What a worker thread does, from its Python name (the peers left out)."""
    if is_call_thread:
        return CALL_THREAD
    if name is None:
        return OTHER
    if name.startswith("Dummy-"):  # threads Python did not start: Ray's, for the actor's concurrency groups
        return GROUP
    role = thread_role(name)
    return ROLES.get(role, role)


def alone_ms(fns: tuple, workers: int, repeat: int = 30) -> float:
    """Median CPU of one worker's step body (batch, forward, backward, optimizer step) run alone in this process,
    one torch thread as in the workers: the model's own cost, without the other workers on the cores."""
    import torch

    model_fn, optimizer_fn, loss_fn, data_fn = fns
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = model_fn()
    optimizer = optimizer_fn(model.parameters())
    batches, times = iter(data_fn(0, workers)), []
    for _ in range(repeat + 5):
        t0 = time.thread_time()
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(data_fn(0, workers))
            batch = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model, batch).backward()
        optimizer.step()
        times.append(time.thread_time() - t0)
    torch.set_num_threads(threads)
    return statistics.median(times[5:]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--strategy", default="ring")
    p.add_argument("--codec", default="onebit")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", default=None, help="write trainer_cpu.md/.json here")
    args = p.parse_args()
    import ray

    from casync.datasets.digits import SGD, DigitsData, DigitsMLP, cross_entropy
    from casync.training import Trainer

    started = time.time()
    fns = (DigitsMLP.named(args.model), SGD(), cross_entropy, DigitsData(batch_size=32, seed=0))
    model_ms = alone_ms(fns, args.workers)
    with Trainer(*fns, workers=args.workers, strategy=args.strategy, codec=args.codec, progress=False) as trainer:
        trainer.fit(steps=args.warmup)
        actors, workers = trainer._engine.actors, trainer._engine.workers  # (internal: the Trainer's actors)
        pids = dict(zip(workers, ray.get([actors[w].pid.remote() for w in workers])))
        names = {(pids[w], tid): name for w in workers
                 for tid, name in ray.get(actors[w].thread_names.remote()).items()}
        call_threads = ray.get([actors[w].call_thread.remote() for w in workers])
        calls = {(pids[w], tid) for w, tid in zip(workers, call_threads)}
        m0, p0, t0 = snapshot(list(pids.values()))
        w0 = time.time()
        history = trainer.fit(steps=args.steps)
        wall = time.time() - w0
        m1, p1, t1 = snapshot(list(pids.values()))
        labels = {pid: label for pid, value in p1.items() if value > p0.get(pid, value)
                  and (label := process_label(pid))}  # while the actors still run
    steps, n = args.steps, args.workers
    by_thread = collections.Counter()
    for key, value in t1.items():
        by_thread[thread_label(names.get(key), key in calls)] += value - t0.get(key, value)
    by_process = collections.Counter()
    for pid, label in labels.items():
        by_process[label] += p1[pid] - p0.get(pid, p1[pid])
    stat = {k: b - a for k, a, b in zip(STAT_FIELDS, m0, m1)}
    cores = os.cpu_count() or 1

    def per_step(value: float, per: int = 1) -> float:
        return value / TICK / steps / per * 1e3

    thread_total = sum(by_thread.values())
    worker_ms = per_step(thread_total, n)
    all_ms = per_step(sum(by_process.values()))
    busy_ms = per_step(sum(v for k, v in stat.items() if k not in ("idle", "iowait")))
    step_ms = wall / steps * 1e3
    sync_ms = statistics.mean(r.sync_s for r in history) * 1e3
    ops_ms = statistics.mean(r.sync_cpu_s for r in history) * 1e3
    compute_ms = statistics.mean(r.compute_s for r in history) * 1e3
    command = (f"python benchmarks/trainer_cpu.py --model {args.model} --workers {n} --strategy {args.strategy} "
               f"--codec {args.codec} --warmup {args.warmup} --steps {steps}"
               + (f" --out {args.out}" if args.out else ""))
    threads = [[k, f"{per_step(v, n):.1f}", f"{100 * v / max(1, thread_total):.0f}"]
               for k, v in by_thread.most_common() if v]
    text = (f"# Where a Trainer step's CPU goes: {args.model}, {n} workers, {args.strategy}/{args.codec}\n\n"
            f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {time.time() - started:.0f} s "
            f"by\n\n```\n{command}\n```\n\n"
            f"{cores} cores, load average at the end {os.getloadavg()[0]:.2f}. {steps} steps after {args.warmup} "
            f"warm-up steps: **{step_ms:.1f} ms per step** (driver's wall clock), the Trainer's own records: "
            f"compute {compute_ms:.1f} ms, **sync {sync_ms:.1f} ms** (a worker's first to last sync op), the sync's "
            f"ops {ops_ms:.1f} ms of CPU per worker.\n\n"
            "## A worker's threads\n\n"
            + markdown_table(["thread", "ms of CPU per worker and step", "%"], threads)
            + f"\n\n**{worker_ms:.1f} ms** of CPU per worker and step; {n} workers: {n * worker_ms:.1f} ms per step. "
            f"The same step body (batch, forward, backward, optimizer step) alone in one process, before the "
            f"Trainer started: {model_ms:.1f} ms of CPU (median of 30).\n\n"
            "## Every process, and the cores\n\n"
            + markdown_table(["process", "ms of CPU per step"],
                             [[k, f"{per_step(v):.1f}"] for k, v in by_process.most_common(10) if per_step(v) >= 0.1])
            + f"\n\nAll processes: {all_ms:.1f} ms of CPU per step; the machine's counters: {busy_ms:.1f} ms busy of "
            f"{cores} × {step_ms:.1f} = {cores * step_ms:.1f} ms ({100 * busy_ms / (cores * step_ms):.0f} %). "
            f"On {cores} cores the processes' CPU alone takes {all_ms / cores:.1f} ms of each {step_ms:.1f} ms step.\n")
    raw = dict(model=args.model, workers=n, strategy=args.strategy, codec=args.codec, warmup=args.warmup, steps=steps,
               wall_s=wall, step_ms=step_ms, model_step_alone_ms=model_ms, sync_ms=sync_ms, sync_ops_cpu_ms=ops_ms,
               compute_ms=compute_ms,
               threads_ms_per_worker_step={k: per_step(v, n) for k, v in by_thread.items()},
               processes_ms_per_step={k: per_step(v) for k, v in by_process.items()},
               machine_ms_per_step={k: per_step(v) for k, v in stat.items()}, cores=cores)
    print(text)
    if args.out:
        print(write_results(args.out, "trainer_cpu", text, raw))


if __name__ == "__main__":
    main()
