"""What the ranks of the DistributedOptimizer tests run (see ``harness.run_ranks``)."""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

import casync.torch as ct
from tests.engines.conformance import SHAPES, step_grads
from tests.torch.scenarios import GradientModel, batch, fail_encodes, mlp, params


def feed(model: torch.nn.Module, grads: dict[str, np.ndarray]) -> None:
    device = next(model.parameters()).device
    model({n: torch.from_numpy(g).to(device) for n, g in grads.items()}).backward()


def synced(rank: int, world: int, steps: int = 4, device: str = "cpu") -> dict[str, Any]:
    """Gradients after synchronize(): per step one backward pass; then with backward_passes_per_step=2.
    ``device``: where the parameters and gradients live (``"cuda"``: the rank's GPU)."""
    model = GradientModel(SHAPES).to(device)
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters(),
                                  strategy="ring", codec="onebit", bucket_bytes=4096, check_every=2)
    seen = []
    for step in range(steps):
        opt.zero_grad()
        feed(model, step_grads(world, step)[rank])
        opt.synchronize()
        seen.append({n: p.grad.cpu().numpy().copy() for n, p in model.named_parameters()})
        opt.step()
    accumulated = GradientModel(SHAPES).to(device)
    acc = ct.DistributedOptimizer(torch.optim.SGD(accumulated.parameters(), lr=0.0), accumulated.named_parameters(),
                                  strategy="allgather", codec="topk:ratio=0.1", bucket_bytes=4096,
                                  backward_passes_per_step=2, compute_threads=2)  # two ops at once: same floats
    for step in range(2):
        acc.zero_grad()
        feed(accumulated, step_grads(world, 2 * step)[rank])
        feed(accumulated, step_grads(world, 2 * step + 1)[rank])
        acc.step()
    acc_grads = {n: p.grad.cpu().numpy().copy() for n, p in accumulated.named_parameters()}
    too_many = None
    try:
        feed(accumulated, step_grads(world, 0)[rank])
        feed(accumulated, step_grads(world, 1)[rank])
        feed(accumulated, step_grads(world, 2)[rank])
    except RuntimeError as exc:
        too_many = str(exc)
    return {"grads": seen, "plan": opt.plan.to_dict(), "acc": acc_grads, "acc_plan": acc.plan.to_dict(),
            "too_many": too_many}


def training(rank: int, world: int) -> dict[str, Any]:
    """Parameters broadcast from rank 0; clip between synchronize() and step(); an LR scheduler on the wrapper;
    a checkpoint round trip continues bit for bit."""
    def make(seed: int) -> tuple[torch.nn.Module, ct.DistributedOptimizer]:
        model = mlp(seed)
        opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                      model.named_parameters(), codec="onebit", strategy="ps", bucket_bytes=8192)
        return model, opt

    def run(model: torch.nn.Module, opt: ct.DistributedOptimizer, steps: range, scheduler: Any) -> list[float]:
        losses = []
        for step in steps:
            x, y = batch(step, rank)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            scheduler.step()
            losses.append(loss.item())
        return losses

    model, opt = make(seed=rank)  # different on every rank: rank 0's wins
    start = params(model)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    losses = run(model, opt, range(4), scheduler)
    checkpoint = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "sched": scheduler.state_dict()})
    run(model, opt, range(4, 7), scheduler)
    straight = params(model)
    model2, opt2 = make(seed=99)
    scheduler2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    model2.load_state_dict(checkpoint["model"])
    opt2.load_state_dict(checkpoint["opt"])
    scheduler2.load_state_dict(checkpoint["sched"])
    run(model2, opt2, range(4, 7), scheduler2)
    from torch.distributed.distributed_c10d import _world

    for o in (opt, opt2):
        o.close()
    groups = len(_world.pg_map)
    frozen = mlp(seed=rank)  # a frozen layer, different on every rank: rank 0's wins too
    frozen[0].weight.requires_grad_(False)
    opt3 = ct.DistributedOptimizer(torch.optim.SGD([p for p in frozen.parameters() if p.requires_grad], lr=0.05),
                                   frozen.named_parameters(), codec="onebit")
    opt3.close()
    return {"start": start, "losses": losses, "straight": straight, "resumed": params(model2),
            "lr": opt.param_groups[0]["lr"], "frozen": params(frozen)["0.weight"],
            "groups_after_close": len(_world.pg_map) - groups}


def grad_scaler(rank: int, world: int) -> dict[str, Any]:
    """AMP with a GradScaler.  Horovod's idiom (synchronize, unscale_, skip_synchronize + scaler.step) where rank
    0's loss overflows at step 0, so the scaler skips that step() (after synchronize()): the next steps must
    still sync.  Then PyTorch's bare recipe (scaler.step(opt) unscales the local gradients before the sync
    replaces them): refused, not an update with the scaled gradients."""
    model = mlp(rank)
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                                  codec="onebit", strategy="ring", timeout_s=20)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    applied = []
    for step in range(4):
        x, y = batch(step, rank)
        if step == 0 and rank == 0:
            x[0, 0] = float("inf")
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scale = scaler.get_scale()
        scaler.update()
        applied.append(scaler.get_scale() == scale)
    bare = None
    x, y = batch(4, rank)
    opt.zero_grad()
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    try:
        scaler.step(opt)
    except RuntimeError as exc:
        bare = str(exc)
    opt.close()
    return {"applied": applied, "params": params(model), "bare": bare}


def loaded_on_rank_0_only(rank: int, world: int) -> dict[str, Any]:
    """The optimizer's checkpoint loaded on rank 0 only: a clear error on every rank at the first sync."""
    def make() -> tuple[torch.nn.Module, ct.DistributedOptimizer]:
        model = mlp(0)
        return model, ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                                              codec="onebit", timeout_s=20)

    def run(model: torch.nn.Module, opt: ct.DistributedOptimizer, steps: range) -> None:
        for step in steps:
            x, y = batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    model, opt = make()
    run(model, opt, range(3))
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    model, opt = make()
    model.load_state_dict(saved["model"])
    if rank == 0:
        opt.load_state_dict(saved["opt"])
    try:
        run(model, opt, range(3, 5))
    except Exception as exc:
        return {"kind": type(exc).__name__, "message": str(exc)}
    return {"kind": None}


def op_fails(rank: int, world: int, transport: str = "gloo") -> dict[str, Any]:
    """Rank 1's encodes fail in step 2 of a DistributedOptimizer job: every rank's synchronize() must fail at once
    naming worker:1, not at the group's 30 s timeout.  Rank 1 stays until the others are done (its exit would
    close the connections, which they would notice at once without knowing why)."""
    import time

    model = mlp()
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                                  codec="onebit", strategy="ring", bucket_bytes=4096, timeout_s=30.0,
                                  transport=transport)
    out: dict[str, Any] = {"kind": None}
    for step in range(3):
        if step == 2 and rank == 1:
            fail_encodes()
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        start = time.monotonic()
        try:
            opt.step()
        except Exception as exc:
            out = {"kind": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start}
            break
    if rank == 1:
        time.sleep(4.0)  # still alive while the others fail (they must not need its exit to notice)
    return out
