"""What the ranks of the accuracy-keeper tests run (see ``harness.run_ranks``): DGC's and CD-SGD's keepers in
the DDP hook and DistributedOptimizer, on gradients chosen by the test.  :func:`every_scenario` runs them all in
one start of the ranks (starting them costs more than most scenarios)."""
from __future__ import annotations

import io
import math
import traceback
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import casync.torch as ct
from tests.engines.conformance import SHAPES, step_grads
from tests.torch.scenarios import GradientModel, batch, mlp, params

CLIP = 2 * math.sqrt(2)  # with 2 ranks the threshold is CLIP / sqrt(2) = 2
CLIP_GRADS = [{"a": [3.0], "b": [4.0]}, {"a": [0.6], "b": [0.8]}]  # global norms 5 (clipped to 2) and 1 (kept)
MASK_GRADS = [[4.0, 1.0, 2.0, 0.5], [1.0, 3.0, 0.5, 2.0]]  # per rank, every step


def _feed(model: torch.nn.Module, grads: dict[str, Any]) -> None:
    model({n: torch.tensor(g, dtype=torch.float32) for n, g in grads.items()}).backward()


def _grads(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}


def clip_and_momentum(rank: int, world: int) -> dict[str, Any]:
    """Synced gradients under DGC's clipping (optimizer, and hook with momentum correction), and momentum
    correction with masking on one 4-element tensor with topk (one coordinate of four per rank and step)."""
    out: dict[str, Any] = {}
    model = GradientModel({"a": (1,), "b": (1,)})
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters(),
                                  codec="none", dgc_clip_norm=CLIP)
    _feed(model, CLIP_GRADS[rank])
    opt.synchronize()
    out["clipped"] = _grads(model)
    opt.close()

    module = GradientModel({"a": (1,), "b": (1,)})
    ddp = DDP(module, bucket_cap_mb=1e-6)  # after DDP's rebuild each parameter is a bucket of its own
    state = ct.CasyncState(codec="none", strategy="ring", dgc_clip_norm=CLIP, momentum_correction=0.5,
                           optimizer=torch.optim.SGD(module.parameters(), lr=0.0))
    ddp.register_comm_hook(state, ct.comm_hook)
    out["hook"] = []
    for _ in range(4):  # iterations 0, 1: uncompressed all-reduce; 2, 3: the plan
        module.zero_grad(set_to_none=False)
        _feed(ddp, CLIP_GRADS[rank])
        out["hook"].append(_grads(module))
    out["hook_buckets"] = len(state.plan.buckets)

    model = GradientModel({"w": (4,)})
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters(),
                                  strategy="allgather", codec="topk:ratio=0.25", momentum_correction=0.5,
                                  momentum_masking=True)
    out["masked"] = []
    for _ in range(2):
        opt.zero_grad()
        _feed(model, {"w": MASK_GRADS[rank]})
        opt.step()
        casync = opt.state_dict()["casync"]
        out["masked"].append({"synced": model.w.grad.numpy().copy(),
                              "u": {r: v["w"].numpy().copy() for r, v in casync["keepers"]["momentum"].items()},
                              "e": {r: v["w"].numpy().copy() for r, v in casync["residuals"].items()}})
    opt.close()
    return out


def warmup(rank: int, world: int) -> dict[str, Any]:
    """Nonzeros of the synced gradient per step under the sparsity warm-up (every rank feeds the same gradient, so
    the synced one has exactly k nonzeros), through the optimizer and the hook."""
    g = {"w": [float(i + 1) for i in range(16)]}
    model = GradientModel({"w": (16,)})
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters(),
                                  strategy="allgather", codec="topk:ratio=0.25", warmup_steps=2,
                                  warmup_start_ratio=1.0)
    counts = []
    for _ in range(4):
        opt.zero_grad()
        _feed(model, g)
        opt.step()
        counts.append(int(np.count_nonzero(model.w.grad.numpy())))
    opt.close()
    module = GradientModel({"w": (16,)})
    ddp = DDP(module)
    state = ct.CasyncState(strategy="allgather", codec="topk:ratio=0.25", warmup_steps=4, warmup_start_ratio=1.0)
    ddp.register_comm_hook(state, ct.comm_hook)
    hook = []
    for _ in range(6):
        module.zero_grad(set_to_none=False)
        _feed(ddp, g)
        hook.append(int(np.count_nonzero(module.w.grad.numpy())))
    return {"optimizer": counts, "hook": hook}


def compensation(rank: int, world: int) -> dict[str, Any]:
    """One parameter w, loss a_r * w^2 / 2 (gradient a_r * w, a = 1 and 3), SGD lr 0.25, codec none: w after each
    step() with the delayed update with and without local compensation (eta_local 0.5), and without delay."""
    a = (1.0, 3.0)[rank]
    out: dict[str, Any] = {}
    for mode, extra in {"plain": {}, "delayed": dict(delayed_update=True),
                        "compensated": dict(delayed_update=True, local_compensation=0.5)}.items():
        w = torch.nn.Parameter(torch.ones(1))
        opt = ct.DistributedOptimizer(torch.optim.SGD([w], lr=0.25), [("w", w)], codec="none", **extra)
        seen, grads = [], []
        for _ in range(3):
            opt.zero_grad()
            (0.5 * a * w * w).sum().backward()
            grads.append(float(w.grad))
            opt.step()
            seen.append(w.item())
        if extra:
            opt.apply_pending()
            seen.append(w.item())
        opt.close()
        out[mode] = {"w": seen, "local_grads": grads}
    return out


def full_steps(rank: int, world: int) -> dict[str, Any]:
    """start_iter=2, full_sync_every=3 with onebit: which steps go uncompressed, their results, the residuals."""
    model = GradientModel(SHAPES)
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters(),
                                  strategy="ring", codec="onebit", bucket_bytes=4096, start_iter=2, full_sync_every=3)
    out: dict[str, Any] = {"full": [], "grads": [], "residuals": []}
    for step in range(6):
        opt.zero_grad()
        model({n: torch.from_numpy(g) for n, g in step_grads(world, step)[rank].items()}).backward()
        opt.step()
        out["full"].append(opt.stats["full"])
        out["grads"].append(_grads(model))
        out["residuals"].append({r: {n: t.numpy().copy() for n, t in v.items()}
                                 for r, v in opt.state_dict()["casync"]["residuals"].items()})
    out["plan"] = opt.plan.to_dict()
    opt.close()
    return out


def _train_optimizer(model: torch.nn.Module, opt: Any, rank: int, steps: range) -> None:
    for step in steps:
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def resume_optimizer(rank: int, world: int) -> dict[str, Any]:
    """Train 3 steps, save, train 3 more; fresh objects from the checkpoint train the same 3: bit for bit.  DGC
    (clipping, momentum correction and masking, mid warm-up) and CD-SGD (full steps, delayed update with
    compensation in flight at the save)."""
    configs = {
        "dgc": dict(strategy="allgather", codec="topk:ratio=0.1", dgc_clip_norm=1.0, momentum_correction=0.9,
                    momentum_masking=True, warmup_steps=5, warmup_start_ratio=0.5),
        "cdsgd": dict(strategy="ring", codec="onebit", start_iter=1, full_sync_every=2, delayed_update=True,
                      local_compensation=0.02),
    }
    out = {}
    for name, config in configs.items():
        def make(seed: int) -> tuple[torch.nn.Module, Any]:
            model = mlp(seed)
            return model, ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                                  model.named_parameters(), check_every=2, **config)
        model, opt = make(0)
        _train_optimizer(model, opt, rank, range(3))
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
        _train_optimizer(model, opt, rank, range(3, 6))
        if config.get("delayed_update"):
            opt.apply_pending()
        straight = params(model)
        opt.close()
        buffer.seek(0)
        ckpt = torch.load(buffer, weights_only=True)
        model2, opt2 = make(seed=7)
        model2.load_state_dict(ckpt["model"])
        opt2.load_state_dict(ckpt["opt"])
        _train_optimizer(model2, opt2, rank, range(3, 6))
        if config.get("delayed_update"):
            opt2.apply_pending()
        out[name] = {"straight": straight, "resumed": params(model2), "iteration": ckpt["opt"]["casync"]["iteration"],
                     "pending": (ckpt["opt"].get("delayed") or {}).get("step")}
        opt2.close()
    return out


def _train_ddp(ddp: DDP, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    for step in steps:
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()


def resume_hook(rank: int, world: int) -> dict[str, Any]:
    """The hook with every DGC keeper, saved at iteration 4 (compressed from 2, warm-up to 6), resumed in fresh
    objects: bit for bit; the momentum is zero wherever the residual is."""
    config = dict(strategy="allgather", codec="topk:ratio=0.1", dgc_clip_norm=1.0, momentum_correction=0.9,
                  momentum_masking=True, warmup_steps=6, warmup_start_ratio=0.5, check_every=3)
    model = mlp(0)
    ddp = DDP(model, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)  # found by the hook and checked: no momentum of its own
    state = ct.CasyncState(**config)
    ddp.register_comm_hook(state, ct.comm_hook)
    _train_ddp(ddp, opt, rank, range(4))
    buffer = io.BytesIO()
    saved = state.state_dict()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "casync": saved}, buffer)
    role = f"worker:{rank}"
    u = {n: t.numpy().reshape(-1) for n, t in saved["keepers"]["momentum"][role].items()}
    e = {n: t.numpy().reshape(-1) for n, t in saved["residuals"][role].items()}
    unmasked = sum(int(np.count_nonzero(u[n][e[n] == 0])) for n in e)
    _train_ddp(ddp, opt, rank, range(4, 7))
    straight = params(model)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)
    model2 = mlp(seed=5)
    model2.load_state_dict(ckpt["model"])
    state2 = ct.CasyncState(**config)
    state2.load_state_dict(ckpt["casync"])
    ddp2 = DDP(model2, bucket_cap_mb=0.004)
    ddp2.register_comm_hook(state2, ct.comm_hook)
    opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.05)
    opt2.load_state_dict(ckpt["opt"])
    _train_ddp(ddp2, opt2, rank, range(4, 7))
    return {"straight": straight, "resumed": params(model2), "unmasked": unmasked,
            "sent": sum(int(np.count_nonzero(e[n] == 0)) for n in e), "iteration": saved["iteration"]}


def refusals(rank: int, world: int) -> dict[str, str]:
    """Errors that need a process group: masking on a dense codec (optimizer), the hook finding an optimizer with
    momentum at its first iteration, state_dict() between backward and step() with the delayed update."""
    out = {}
    model = mlp(0)
    try:
        ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                codec="onebit", momentum_correction=0.9, momentum_masking=True)
    except ValueError as exc:
        out["dense"] = str(exc)
    ddp = DDP(mlp(0))
    keep = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)  # noqa: F841 - found by the hook
    ddp.register_comm_hook(ct.CasyncState(codec="none", momentum_correction=0.9), ct.comm_hook)
    x, y = batch(0, rank)
    try:
        torch.nn.functional.mse_loss(ddp(x), y).backward()
    except ValueError as exc:
        out["hook_momentum"] = str(exc)
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                  codec="none", delayed_update=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    try:
        opt.state_dict()
    except RuntimeError as exc:
        out["mid_step"] = str(exc)
    opt.step()
    out["after_step"] = sorted(opt.state_dict())
    opt.close()
    return out



SCENARIOS = ("clip_and_momentum", "warmup", "compensation", "full_steps", "resume_optimizer", "resume_hook", "refusals")


def every_scenario(rank: int, world: int) -> dict[str, Any]:
    """Each scenario's result, or ``{"error": ...}`` with what it raised (the others still run)."""
    out = {}
    for name in SCENARIOS:
        try:
            out[name] = globals()[name](rank, world)
        except Exception as exc:  # noqa: BLE001 - reported by the test of that scenario
            out[name] = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"}
    return out
