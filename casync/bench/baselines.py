"""Baselines a casync strategy is compared with: ``torch.distributed`` on gloo, on the same gradients.

Every baseline runs as ``world`` real processes (one per worker, :func:`run_baselines` starts them with the
setup's command prefix, e.g. inside one network namespace each) that synchronize the benchmark's gradients
(:func:`casync.datasets.gradients.worker_flat`, the very tensors casync syncs):

* ``gloo-tensor``  ``all_reduce`` + divide, one call per tensor;
* ``gloo-bucket``  ``all_reduce`` + divide of 25 MiB buckets of consecutive tensors (DDP's bucket size);
  the reference the speed-ups are computed against;
* ``ddp``          a ``DistributedDataParallel`` model whose parameters have the model's shapes and whose
  backward pass yields exactly the benchmark gradients, default all-reduce hook (no compression);
* ``ddp-fp16``     the same with ``default_hooks.fp16_compress_hook``;
* ``ddp-powersgd-r1`` / ``-r4``  the same with ``powerSGD_hook`` (``matrix_approximation_rank`` 1 or 4,
  error feedback and warm start on, compressing from the first timed iteration);
* ``ddp-casync:<strategy label>:<codec>``  the same with ``casync.torch.comm_hook`` running that casync
  configuration on DDP's buckets (``casync.bench.hooks``), from its first planned iteration on;
* ``ddp-nocomm``   the same with a hook that communicates nothing (each rank keeps its own gradient): not a
  sync, but the floor of every DDP row, since a DDP row's span runs from the first bucket's hook call, and
  the later buckets' backward and DDP's bucket copies fall inside it whatever the hook does.

Timing, comparable with casync's sync span (first op of any worker to last op of any worker): per
iteration every rank passes a barrier, then records wall-clock start and end of its synchronization; the
iteration's sync time is ``max(end) - min(start)`` over ranks.  For gloo that is the all_reduce calls and
the division; for DDP it runs from the first bucket's comm hook call to the last bucket's reduced gradient
(the hooks' compression, decompression and error feedback included, and the small backward work of the
later buckets that overlaps them).  ``backward_s`` is the whole forward+backward wall time.

The ranks run on the CPU (gloo) with GPUs hidden (``CUDA_VISIBLE_DEVICES=""``): PyTorch's ``powerSGD_hook``
calls ``torch.cuda.synchronize`` on a CPU bucket's device whenever CUDA is available, which raises, so on a
machine with a GPU the PowerSGD rows would fail.

Bytes on the wire assume a ring all-reduce (gloo's algorithm for large CPU tensors): all ranks together
send ``2 (N-1)`` times the all-reduced payload, matching how ``plan.wire_bytes()`` counts casync's sends.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..datasets.gradients import exact_mean, model_shapes, worker_flat
from ..engines.memory import WARMUP_SYNCS
from ..engines.memory import keep_freed_memory
from ..sim.costmodel import ClusterModel, Profile
from .hooks import HOOK_FIRST_PLANNED_ITER, casync_hook, hook_arguments, is_hook, parse_hook_variant
from .ranks import RankError, RankLauncher, leave_without_teardown, run_ranks

BASELINES: dict[str, str] = {
    "gloo-tensor": "gloo all_reduce, per tensor",
    "gloo-bucket": "gloo all_reduce, 25 MiB buckets",
    "ddp": "DDP allreduce_hook",
    "ddp-fp16": "DDP fp16_compress_hook",
    "ddp-powersgd-r1": "DDP powerSGD_hook rank 1",
    "ddp-powersgd-r4": "DDP powerSGD_hook rank 4",
    "ddp-nocomm": "DDP, no communication (floor)",
}
#: the baseline that only measures what every DDP row spends besides communication
NO_COMMUNICATION = "ddp-nocomm"
REFERENCE = "gloo-bucket"
BUCKET_BYTES = 25 * 1024 * 1024
POWERSGD_START_ITER = 2  # the smallest PyTorch allows with error feedback / warm start
#: extra warm-up iterations of every DDP row (PyTorch's hooks and casync's alike), so that they are timed in
#: steady state: a rank's heap grows to its working set over the first iterations of a hook that allocates
#: per step (casync's hook: about ten), and a page fault costs 13-37 us on this VM (docs/performance.md)
DDP_SETTLE_ITERS = 10


class BaselineError(RankError):
    """A baseline rank failed or did not finish in time; the message carries its output."""


# -----------------------------------------------------------------------------------------------------
# inside one rank
# -----------------------------------------------------------------------------------------------------

def _buckets(shapes: list[tuple[str, tuple[int, ...]]], cap_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) element ranges of consecutive tensors grouped up to ``cap_bytes``, DDP-style."""
    out, start, size, offset = [], 0, 0, 0
    for _, shape in shapes:
        nbytes = 4 * math.prod(shape)
        if size and size + nbytes > cap_bytes:
            out.append((start, offset))
            start, size = offset, 0
        offset += nbytes // 4
        size += nbytes
    if offset > start:
        out.append((start, offset))
    return out


def _gradient_model(shapes: list[tuple[str, tuple[int, ...]]]):
    """A module whose parameters have ``shapes`` (registered in forward order, so DDP buckets them in
    backward order) and whose ``forward(grads)`` is ``sum(p * g)``: backward leaves exactly ``g`` in
    ``p.grad``."""
    import torch

    class GradientModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(shape)) for _, shape in reversed(shapes))

        def forward(self, grads: list) -> Any:
            return sum((p * g).sum() for p, g in zip(self.weights, grads))

    return GradientModel()


def _timed_hook(hook: Callable, marks: list[tuple[str, float]]) -> Callable:
    """Wrap a DDP comm hook: record when each bucket's hook is called and when its result is ready."""

    def wrapper(state: Any, bucket: Any) -> Any:
        marks.append(("start", time.time()))
        fut = hook(state, bucket)

        def done(f: Any) -> Any:
            marks.append(("end", time.time()))
            return f.value()

        return fut.then(done)

    return _annotated(wrapper)


def _annotated(hook: Callable) -> Callable:
    """``hook`` with the annotations DDP checks a comm hook's for (this module's are strings, from
    ``__future__`` annotations, which DDP refuses)."""
    import torch
    import torch.distributed as dist

    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    return hook


def _no_communication(state: Any, bucket: Any) -> Any:
    """A DDP comm hook that keeps the rank's own gradient: a future already holding the bucket."""
    import torch

    future: Any = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _one_bucket_at_a_time(hook: Callable) -> Callable:
    """Start a bucket's hook only after the previous bucket's finished.

    PowerSGD issues its second all-reduce from a callback of its first; with several buckets in flight the
    ranks then enqueue gloo collectives in different orders, and gloo (which tags collectives in enqueue
    order) fails with "Received data size doesn't match expected size".  Waiting here keeps the order the
    same everywhere; the wait runs on the autograd thread, whose remaining work here is tiny.
    """
    last: list[Any] = [None]

    def serial(state: Any, bucket: Any) -> Any:
        if last[0] is not None:
            last[0].wait()
        last[0] = hook(state, bucket)
        return last[0]

    return serial


def ddp_hook(variant: str, seed: int = 0, compute_threads: int = 1, cluster: Any = None,
             strategies: Sequence[str] = (), **casync_options: Any) -> tuple[Any, Callable]:
    """``(state, hook)`` of a DDP row for ``ddp.register_comm_hook``: PyTorch's allreduce, fp16 or PowerSGD hook
    (PowerSGD seeded with ``seed``, one bucket at a time), casync's for ``ddp-casync:...`` (``compute_threads``,
    ``cluster`` and ``casync_options`` go to its ``CasyncState``; an ``auto`` row chooses among the strategies of
    the fixed hook rows' labels ``strategies``), or the hook without communication."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if variant == "ddp":
        return None, default_hooks.allreduce_hook
    if variant == "ddp-fp16":
        return None, default_hooks.fp16_compress_hook
    if variant.startswith("ddp-powersgd-r"):
        rank = int(variant.rsplit("r", 1)[1])
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=POWERSGD_START_ITER, use_error_feedback=True,
                                            warm_start=True, random_seed=seed)
        return state, _annotated(_one_bucket_at_a_time(powerSGD_hook.powerSGD_hook))
    if is_hook(variant):
        return casync_hook(variant, compute_threads, cluster, strategies, **casync_options)
    if variant == NO_COMMUNICATION:
        return None, _annotated(_no_communication)
    raise ValueError(f"unknown DDP row {variant!r}; choose from {[b for b in BASELINES if b.startswith('ddp')]} "
                     "or ddp-casync:<strategy>:<codec>")


def auto_profile(variant: str, profile: Any) -> dict[str, Any]:
    """``{"profile": profile}`` for an ``auto`` hook row (its planner prices with it, as its prediction does), else
    nothing: a fixed row's plan does not depend on a profile."""
    if profile is None or not is_hook(variant) or hook_arguments(variant)["strategy"] != "auto":
        return {}
    return {"profile": profile}


def _last_start(gathered: list[dict[str, Any]]) -> float:
    """The earliest rank's first hook call of the last timed iteration: where that iteration's sync span starts."""
    return min(g["starts"][-1] for g in gathered)


def _hook_timeline(gathered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's rows of the last timed iteration (``CasyncState.timeline``), its times from the earliest
    rank's first hook call of that iteration (where the row's sync span starts), sorted by start."""
    t0 = _last_start(gathered)
    rows = [dict(r, start=r["start"] - t0, end=r["end"] - t0) for g in gathered for r in g["timeline"]]
    return sorted(rows, key=lambda r: r["start"])


def _handed(state: Any) -> dict[str, float]:
    """When this rank handed each plan bucket to its runner in the hook's last compressed iteration
    (``time.time()``)."""
    return dict(state.session.last[0].provided)


def _tx_bytes() -> int | None:
    """Bytes this rank's namespace has sent on its gloo interface, counted by the interface's shaping qdisc
    like casync's (None on loopback, which other processes of the machine share, or without tc)."""
    from .netstat import qdisc_sent_bytes

    iface = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    return None if iface == "lo" else qdisc_sent_bytes(iface)


def _rank_main(args: argparse.Namespace) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    keep_freed_memory()  # what `import casync.torch` at the top of a script does, before torch starts threads
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = args.rank, args.world
    cluster = ClusterModel(**json.loads(args.cluster)) if args.cluster else None
    profile = Profile.load(args.profile) if args.profile else None
    shapes = model_shapes(args.model)
    flat_np = worker_flat(args.model, rank, args.seed)
    flat = torch.from_numpy(flat_np)
    numel = flat.numel()
    views = []
    offset = 0
    for _, shape in shapes:
        n = math.prod(shape)
        views.append((offset, offset + n, shape))
        offset += n
    results: dict[str, Any] = {}
    # an auto hook row chooses among the strategies of the run's fixed hook rows
    hook_labels = [parse_hook_variant(v)[0] for v in args.variants.split(",") if is_hook(v)]
    for variant in args.variants.split(","):
        iters = args.iters
        warmup = args.warmup
        if variant.startswith("ddp"):  # DDP rebuilds its buckets after the first iteration
            warmup = max(warmup, POWERSGD_START_ITER + 1 if variant.startswith("ddp-powersgd") else
                         HOOK_FIRST_PLANNED_ITER + 1 if is_hook(variant) else 2) + DDP_SETTLE_ITERS
        starts, ends, walls, payload = [], [], [], 4 * numel
        if variant.startswith("gloo"):
            work = torch.empty_like(flat)
            if variant == "gloo-tensor":
                chunks = [work[a:b] for a, b, _ in views]
            else:
                chunks = [work[a:b] for a, b in _buckets(shapes, BUCKET_BYTES)]
            for i in range(warmup + iters):
                if i == warmup:
                    tx0 = _tx_bytes()
                work.copy_(flat)
                dist.barrier()
                t0 = time.time()
                for c in chunks:
                    dist.all_reduce(c)
                    c.div_(world)
                t1 = time.time()
                if i >= warmup:
                    starts.append(t0)
                    ends.append(t1)
                    walls.append(t1 - t0)
            reduced = work
        else:
            model = _gradient_model(shapes)
            grads = [flat[a:b].view(shape) for a, b, shape in reversed(views)]  # forward order, like the params
            ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=BUCKET_BYTES / 2**20,
                                                            gradient_as_bucket_view=True)
            marks: list[tuple[str, float]] = []
            state, hook = ddp_hook(variant, args.seed, args.compute_threads, cluster, hook_labels,
                                   **auto_profile(variant, profile))
            payload = 2 * numel if variant == "ddp-fp16" else 0 if variant == NO_COMMUNICATION else payload
            powersgd = variant.startswith("ddp-powersgd")
            ddp.register_comm_hook(state, _timed_hook(hook, marks))
            for i in range(warmup + iters):
                if i == warmup:
                    tx0 = _tx_bytes()
                ddp.zero_grad(set_to_none=False)
                before = (state.total_numel_before_compression, state.total_numel_after_compression) if powersgd else None
                marks.clear()
                dist.barrier()
                t0 = time.time()
                ddp(grads).backward()
                t1 = time.time()
                if i >= warmup:
                    starts.append(min(t for k, t in marks if k == "start"))
                    ends.append(max(t for k, t in marks if k == "end"))
                    walls.append(t1 - t0)
                    if powersgd:
                        payload = 4 * (state.total_numel_after_compression - before[1])
            reduced = torch.cat([p.grad.reshape(-1) for p in reversed(list(model.weights))])
            if is_hook(variant):  # what the plan's sends put on the wire, not a ring all-reduce of a payload
                wire = (state.plan.wire_bytes(), sum(4 * a["numel"] for _, a in state.plan.graph.nodes(data=True)
                                                     if a["op"] == "send"))
        tx1 = _tx_bytes()
        sent = None if tx0 is None or tx1 is None else (tx1 - tx0) // iters  # barriers included: a few bytes
        gathered: list[Any] = [None] * world
        probe = reduced[:: max(1, numel // 4096)].clone()
        dist.all_gather_object(gathered, {"starts": starts, "ends": ends, "walls": walls,
                                          "probe": probe.numpy().tobytes(), "payload": payload, "sent": sent,
                                          "timeline": state.timeline() if is_hook(variant) else None,
                                          "handed": _handed(state) if is_hook(variant) else None})
        if rank == 0:
            spans = [max(g["ends"][i] for g in gathered) - min(g["starts"][i] for g in gathered) for i in range(iters)]
            entry = {"sync_s": spans, "backward_s": [max(g["walls"][i] for g in gathered) for i in range(iters)],
                     "payload_bytes": payload, "dense_bytes": 4 * numel,
                     # (without communication the ranks keep different gradients: nothing to compare)
                     "consistent": variant == NO_COMMUNICATION or all(g["probe"] == gathered[0]["probe"]
                                                                      for g in gathered),
                     "warmup": warmup,
                     "link_bytes": None if any(g["sent"] is None for g in gathered) else sum(g["sent"] for g in gathered)}
            if is_hook(variant):
                entry["wire_bytes"], entry["dense_wire_bytes"] = wire
                entry["timeline"] = _hook_timeline(gathered)
                if state.options.planned:  # what the planner chose per DDP bucket
                    from .predict import plan_choices  # here: a gloo baseline's rank needs no simulator

                    entry["plan"] = plan_choices(state.plan)
                # for the prediction: the plan, and each bucket ready when the last rank handed it over
                t0 = _last_start(gathered)
                entry["sim_plan"] = state.plan.to_dict()
                entry["ready_s"] = {b: max(g["handed"][b] for g in gathered) - t0 for b in gathered[0]["handed"]}
            if args.check and variant != NO_COMMUNICATION:
                exact = torch.from_numpy(exact_mean(args.model, world, args.seed))
                entry["rel_error"] = float(torch.linalg.vector_norm(reduced - exact) / torch.linalg.vector_norm(exact))
            results[variant] = entry
        dist.barrier()
    if rank == 0:
        Path(args.result).write_text(json.dumps(results))
    dist.destroy_process_group()


# -----------------------------------------------------------------------------------------------------
# the launcher
# -----------------------------------------------------------------------------------------------------

def run_baselines(launcher: RankLauncher, model: str, workers: int, variants: Sequence[str], iters: int = 3,
                  warmup: int = WARMUP_SYNCS, seed: int = 0, check: bool = True,
                  timeout_s: float = 900.0, compute_threads: int = 1, cluster: Any = None,
                  profile: Any = None) -> dict[str, Any]:
    """Run ``variants`` on ``workers`` gloo ranks; per variant: sync times (s), payload and wire bytes, checks.
    ``compute_threads``: ops each rank of a DDP + casync hook variant runs at once (``CasyncState``'s);
    ``cluster``: the ``ClusterModel`` an ``auto`` hook variant plans for (required for one); ``profile``: the
    ``Profile`` it plans with (default: the packaged one).

    Raises :class:`BaselineError` (with the failing rank's output) when a rank fails or the run exceeds
    ``timeout_s``; every rank process is ended either way.
    """
    unknown = [v for v in variants if v not in BASELINES and not is_hook(v)]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {list(BASELINES)} or ddp-casync:<strategy>:<codec>")
    for v in variants:
        if is_hook(v) and hook_arguments(v)["strategy"] == "auto" and cluster is None:  # (a bad label fails here)
            raise ValueError(f"{v!r} plans for the setup's cluster model: pass run_baselines(cluster=...)")
    if not variants:
        return {}
    with tempfile.TemporaryDirectory(prefix="casync-baseline-") as tmp:
        result = Path(tmp) / "result.json"
        args = ["--model", model, "--seed", str(seed), "--iters", str(iters), "--warmup", str(warmup),
                "--variants", ",".join(variants), "--result", str(result), "--timeout", str(int(timeout_s)),
                "--compute-threads", str(compute_threads)] + (["--check"] if check else []) \
            + (["--cluster", json.dumps(cluster.to_dict())] if cluster is not None else [])
        if profile is not None:
            args += ["--profile", str(profile.save(Path(tmp) / "profile.json"))]
        run_ranks(launcher, workers, "from casync.bench.baselines import main; main()", args, timeout_s=timeout_s,
                  what=f"baselines {list(variants)} on {model}, {workers} ranks", error=BaselineError)
        if not result.exists():
            raise BaselineError("baseline rank 0 wrote no result")
        raw = json.loads(result.read_text())
    for entry in raw.values():
        entry.setdefault("wire_bytes", 2 * (workers - 1) * entry["payload_bytes"])
        entry.setdefault("dense_wire_bytes", 2 * (workers - 1) * entry["dense_bytes"])
        entry["sync_median_s"] = statistics.median(entry["sync_s"])
    return raw


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="casync.bench.baselines",
                                description="one rank of the gloo/DDP baselines (started by run_baselines)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", required=True, help="host:port of rank 0's TCP store")
    p.add_argument("--model", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=WARMUP_SYNCS)
    p.add_argument("--variants", default=",".join(BASELINES))
    p.add_argument("--result", required=True)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--compute-threads", type=int, default=1, help="ops a casync hook's rank runs at once")
    p.add_argument("--check", action="store_true", help="rank 0 compares its result with the exact mean")
    p.add_argument("--cluster", default=None, help="the ClusterModel (JSON) an auto hook variant plans for")
    p.add_argument("--profile", default=None, help="the profile (JSON file) an auto hook variant plans with")
    _rank_main(p.parse_args(argv))
    leave_without_teardown()


if __name__ == "__main__":
    main()
