"""One rank of the time-to-accuracy mode: trains the task's model once per run it is handed, timing training only.

Per run: the task's seeded model, wrapped in DDP with the configuration's comm hook (or handed to a casync
optimizer instead of DDP), trained for the same steps on this rank's seeded batches.  Training is timed in
segments between evaluation points: every rank starts a segment after a barrier, and the segment counts as the
slowest rank's time; at an evaluation point rank 0 evaluates while the others wait, outside the clock (alike for
every configuration).  A delayed update (CD-SGD) applies its pending update at each evaluation point, inside
the clock, so the model evaluated and compared across ranks is the synced one with every step's update.  A non-finite loss on any rank is learned by all at the next evaluation point, where the
run stops (no per-step collective of its own).  Rank 0 writes each run's result as it finishes, and a progress
line (run, step) at most twice a second.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import time
import zlib
from pathlib import Path
from typing import Any

from ...tasks.schedules import lr_factor
from ..ranks import leave_without_teardown
from .configs import Config, run_options
from .wire import WireCounter

BUCKET_CAP_MB = 25  # DDP's default, as the bench's DDP rows


class Progress:
    """Rank 0's ``run step`` line for the driver's progress bar (rewritten at most every ``every_s``)."""

    def __init__(self, path: str | None, every_s: float = 0.5):
        self.path, self.every_s, self.last = path, every_s, 0.0

    def __call__(self, run: int, step: int, force: bool = False) -> None:
        now = time.monotonic()
        if self.path and (force or now - self.last >= self.every_s):
            Path(self.path).write_text(f"{run} {step}\n")
            self.last = now


def build(config: Config, task: Any, model: Any, lr: float, seed: int, spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``(network to call, optimizer, holder of casync's step stats or the PowerSGD state)`` of a run."""
    import torch

    import casync.torch as ct

    from ..baselines import ddp_hook
    from ..hooks import is_hook

    options = run_options(config.options, spec["steps"], lr)
    if config.optimizer is not None:
        cls = getattr(ct, config.optimizer)
        options = {"check_every": 0, **options}
        if cls is ct.DistributedOptimizer:
            opt = cls(_with_groups(task.optimizer(model.parameters(), lr), config), model.named_parameters(), **options)
        else:  # a casync optimizer of its own (OneBitAdam), on the named parameters
            opt = _with_groups(cls(model.named_parameters(), lr=lr, **options), config)
        return model, opt, opt
    cluster = spec.get("cluster")
    if cluster is not None and is_hook(config.variant):
        from ...sim.costmodel import ClusterModel

        cluster = ClusterModel(**cluster)
    # as the bench's DDP rows: the gradients are views into DDP's buckets (no copy back after the sync)
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB, gradient_as_bucket_view=True)
    state, hook = ddp_hook(config.variant, seed, spec.get("compute_threads", 1),
                           cluster if is_hook(config.variant) else None, **options)
    net.register_comm_hook(state, hook)
    return net, _with_groups(task.optimizer(net.parameters(), lr), config), state


def _with_groups(optimizer: Any, config: Config) -> Any:
    for group in optimizer.param_groups:
        group.update(config.param_groups)
    return optimizer


def train(task: Any, data: Any, config: Config, seed: int, spec: dict[str, Any], rank: int, world: int,
          progress: Any = None) -> dict[str, Any]:
    """One run on this rank; its result (meaningful on rank 0: the metric is evaluated there)."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(seed)
    model = task.model(data, seed)
    numel = sum(p.numel() for p in model.parameters())
    net, opt, holder = build(config, task, model, spec["lr"], seed, spec)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(spec.get("schedule", "constant"), spec["steps"]))
    counter = WireCounter(config, holder, numel, world)
    batches = task.batches(data, rank, world, spec["batch_size"], seed)
    steps, evals = spec["steps"], set(spec["eval_steps"])
    delayed = bool(config.options.get("delayed_update"))
    points: list[dict[str, Any]] = []
    trained, bad, nonfinite, step, last_lr = 0.0, None, None, 0, None
    dist.barrier()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        inputs, targets = next(batches)
        opt.zero_grad(set_to_none=config.optimizer is not None)  # (DDP's gradients stay its bucket views)
        counter.before()
        loss = task.loss(net, inputs, targets)
        loss.backward()
        opt.step()
        last_lr = opt.param_groups[0]["lr"]
        schedule.step()
        counter.step()
        if bad is None and not math.isfinite(float(loss)):
            bad = step
        if progress is not None:
            progress(step)
        if step not in evals:
            continue
        if delayed:  # evaluate the synced model with all `step` updates (w_t, not a rank's local step); inside
            opt.apply_pending()  # the clock: the wait for the sync in flight is training time
        # outside the clock: the slowest rank's segment, and the first non-finite loss of any rank
        key = (bad * world + rank) if bad is not None else (steps + 1) * world
        both = torch.tensor([time.perf_counter() - start, -float(key)], dtype=torch.float64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        trained += float(both[0])
        first = int(-both[1])
        if first < (steps + 1) * world:
            nonfinite = {"step": first // world, "rank": first % world}
            points.append({"step": step, "seconds": trained, "metric": None})
            break
        metric = float(task.evaluate(model, data)) if rank == 0 and config.evaluated else None
        points.append({"step": step, "seconds": trained,
                       "metric": metric if metric is not None and math.isfinite(metric) else None})
        if progress is not None:
            progress(step, force=True)
        dist.barrier()  # the others wait for rank 0's evaluation
        start = time.perf_counter()
    wire = counter.totals()
    result = {"config": config.name, "seed": seed, "points": points, "steps_done": step, "train_seconds": trained,
              "nonfinite": nonfinite, "error": None, "consistent": consistent(model, config, world), "last_lr": last_lr,
              "options": run_options(config.options, steps, spec["lr"]), **wire}
    for closing in {id(x): x for x in (holder, opt)}.values():  # casync's groups and threads, once each
        if hasattr(closing, "close"):
            closing.close()
    return result


def consistent(model: Any, config: Config, world: int) -> bool | None:
    """Whether every rank ends with bit-identical parameters (None for the floor, whose replicas diverge)."""
    import torch.distributed as dist

    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.detach().contiguous().numpy().tobytes(), crc)
    seen: list[Any] = [None] * world
    dist.all_gather_object(seen, crc)
    return None if not config.evaluated else len(set(seen)) == 1


def rank_main(spec: dict[str, Any], rank: int, world: int, master: str) -> None:
    import torch
    import torch.distributed as dist

    from ...engines.memory import keep_freed_memory
    from ...tasks import get_task

    keep_freed_memory()  # what `import casync.torch` at the top of a script does, before torch starts threads
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec["timeout_s"]))
    task = get_task(spec["task"])
    data = task.load(spec["data"])
    results = Path(spec["results"])
    progress = Progress(spec.get("progress") if rank == 0 else None)
    if rank == 0:
        (results / "manifest.json").write_text(json.dumps(getattr(data, "manifest", None), default=str))
    for run in spec["runs"]:
        index = run["index"]
        progress(index, 0, force=True)
        config = Config(**{**run["config"], "tasks": tuple(run["config"]["tasks"])})
        result = train(task, data, config, run["seed"], spec, rank, world,
                       lambda step, force=False: progress(index, step, force))
        if rank == 0:
            (results / f"run_{index}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="casync.bench.tta.rank",
                                description="one rank of the time-to-accuracy mode (started by casync tta)")
    p.add_argument("--spec", required=True, help="the runs and their settings (JSON)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", required=True, help="host:port of rank 0's TCP store")
    args = p.parse_args(argv)
    rank_main(json.loads(Path(args.spec).read_text()), args.rank, args.world, args.master)
    leave_without_teardown()
