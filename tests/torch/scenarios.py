"""What the ranks of the DDP-hook tests run (each function runs on every rank; see ``harness.run_ranks``)."""
from __future__ import annotations

import io
import json
import os
import time
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import casync
import casync.torch as ct
from casync.torch.residuals import ef_encodes
from tests.engines.conformance import SHAPES, step_grads


class GradientModel(torch.nn.Module):
    """Parameters named and shaped as ``shapes``; ``forward(grads)`` is ``sum(p * g)``, so backward leaves
    exactly ``g`` in ``p.grad``: the hook syncs gradients the test chose."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, torch.nn.Parameter(torch.zeros(shape)))

    def forward(self, grads: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum((p * grads[n]).sum() for n, p in self.named_parameters())


def mlp(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4)).to(dtype)


def batch(step: int, rank: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randn(16, 20, generator=g).to(dtype), torch.randn(16, 4, generator=g).to(dtype)


def synced_gradients(rank: int, world: int, configs: list[dict], steps: int = 5, device: str = "cpu",
                     dtype: str = "float32") -> list[dict[str, Any]]:
    """Per config: every step's gradients after DDP + the hook (fed gradients from ``step_grads``), the plan.
    ``device``/``dtype``: where DDP's parameters, gradients and buckets live (``"cuda"``: the rank's GPU)."""
    out = []
    kind = getattr(torch, dtype)
    for config in configs:
        config = dict(config)
        view = config.pop("gradient_as_bucket_view", False)  # DDP's .grad then lives in its bucket buffers
        module = GradientModel(SHAPES).to(device=device, dtype=kind)
        model = DDP(module, bucket_cap_mb=0.008, gradient_as_bucket_view=view)  # 'big' alone, the rest fused
        state = ct.CasyncState(check_every=2, **config)
        model.register_comm_hook(state, ct.comm_hook)
        seen = []
        for step in range(steps):
            grads = step_grads(world, step)[rank]
            model.zero_grad(set_to_none=False)
            model({n: torch.from_numpy(g).to(device=device, dtype=kind) for n, g in grads.items()}).backward()
            seen.append({n: p.grad.cpu().numpy().copy() if kind == torch.float32 else p.grad.float().cpu().numpy()
                         for n, p in model.module.named_parameters()})
        out.append({"grads": seen, "plan": state.plan.to_dict(), "compressing_from": 2,
                    "buckets": len(state.plan.buckets), "iteration": state.iter,
                    "in_place": state.session.stats["in_place"], "lent": state.session.stats["lent"],
                    "as_planned": state.session.stats["as_planned"]})
    return out


def train(model: torch.nn.Module, rank: int, steps: range, hook_state: Any = None, lr: float = 0.05,
          dtype: torch.dtype = torch.float32) -> tuple[DDP, torch.optim.Optimizer, list[float]]:
    ddp = DDP(model, bucket_cap_mb=0.004)
    if hook_state is not None:
        ddp.register_comm_hook(hook_state, ct.comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    return ddp, opt, run_steps(ddp, opt, rank, steps, dtype)


def run_steps(ddp: DDP, opt: torch.optim.Optimizer, rank: int, steps: range, dtype: torch.dtype = torch.float32
              ) -> list[float]:
    losses = []
    for step in steps:
        x, y = batch(step, rank, dtype)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x).float(), y.float())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def params(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {n: p.detach().float().numpy().copy() for n, p in model.named_parameters()}


def plain_vs_hook(rank: int, world: int, steps: int = 8) -> dict[str, Any]:
    """The same training with plain DDP and with DDP + the hook (codec none, every step through the plan from
    iteration 2 on); a half-precision model through the hook too."""
    plain, _, _ = train(mlp(), rank, range(steps))
    hooked, _, losses = train(mlp(), rank, range(steps), ct.CasyncState(codec="none", strategy="ring"))
    half_state = ct.CasyncState(codec="none", strategy="ps")
    half, _, _ = train(mlp(dtype=torch.bfloat16), rank, range(4), half_state, dtype=torch.bfloat16)
    return {"plain": params(plain.module), "hook": params(hooked.module), "losses": losses,
            "half_dtype": str(next(half.module.parameters()).grad.dtype), "half": params(half.module),
            "half_plan_buckets": len(half_state.plan.buckets)}


def resume(rank: int, world: int, codec: str = "onebit", strategy: str = "ring") -> dict[str, Any]:
    """Train 5 steps, checkpoint (through torch.save / torch.load, weights only), train 4 more; then rebuild
    everything from the checkpoint and train the same 4 steps.  Also: loading onto another model is refused."""
    config = dict(codec=codec, strategy=strategy, check_every=3)
    ddp, opt, _ = train(mlp(), rank, range(5), ct.CasyncState(**config))
    state = ddp._comm_hooks[0][1]
    buffer = io.BytesIO()
    torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "casync": state.state_dict()}, buffer)
    run_steps(ddp, opt, rank, range(5, 9))
    straight = params(ddp.module)

    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)
    model = mlp(seed=123)  # other initial values: everything must come from the checkpoint
    model.load_state_dict(ckpt["model"])
    restored = ct.CasyncState(**config)
    restored.load_state_dict(ckpt["casync"])
    ddp2 = DDP(model, bucket_cap_mb=0.004)  # a fresh DDP: its first iteration's buckets are not the plan's
    ddp2.register_comm_hook(restored, ct.comm_hook)
    opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.05, momentum=0.9)
    opt2.load_state_dict(ckpt["opt"])
    run_steps(ddp2, opt2, rank, range(5, 9))
    resumed = params(ddp2.module)

    refused = {}
    try:
        ct.CasyncState(codec="topk:ratio=0.1", strategy=strategy).load_state_dict(ckpt["casync"])
    except ValueError as exc:
        refused["options"] = str(exc)
    other = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    wrong = ct.CasyncState(**config)
    wrong.load_state_dict(ckpt["casync"])
    ddp3 = DDP(other)
    ddp3.register_comm_hook(wrong, ct.comm_hook)
    try:
        ddp3(torch.randn(2, 20)).sum().backward()
    except ValueError as exc:
        refused["model"] = str(exc)
    plan = casync.SyncPlan.from_dict(json.loads(ckpt["casync"]["plan"]))
    return {"straight": straight, "resumed": resumed, "refused": refused, "plan_roles": sorted(
        {role for _, role, _, _, _ in ef_encodes(plan)}), "owners": sorted({a for *_, a in ef_encodes(plan)}),
            "residual_roles": sorted(ckpt["casync"]["residuals"]), "iteration": ckpt["casync"]["iteration"]}


def layouts(rank: int, world: int) -> dict[str, Any]:
    """The plan is built from DDP's final buckets: with and without ``static_graph`` (DDP rebuilds a step later),
    and in a process resumed from a state saved before the plan existed (its first iteration's buckets are
    DDP's initial ones)."""
    out = {}
    for static in (False, True):
        ddp = DDP(mlp(), bucket_cap_mb=0.004, static_graph=static)
        state = ct.CasyncState(codec="onebit", strategy="ring")
        ddp.register_comm_hook(state, ct.comm_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        run_steps(ddp, opt, rank, range(6))
        out[f"static={static}"] = {"plan": state.plan.to_dict(), "as_planned": state.session.stats.get("as_planned"),
                                   "ddp_buckets": len(state.plan.buckets)}
    early = ct.CasyncState(codec="onebit", strategy="ring")
    ddp = DDP(mlp(), bucket_cap_mb=0.004)
    ddp.register_comm_hook(early, ct.comm_hook)
    run_steps(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), rank, range(1))
    saved = early.state_dict()  # iteration 1, no plan yet
    resumed = ct.CasyncState(codec="onebit", strategy="ring")
    resumed.load_state_dict(saved)
    ddp = DDP(mlp(), bucket_cap_mb=0.004)
    ddp.register_comm_hook(resumed, ct.comm_hook)
    run_steps(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), rank, range(1, 5))
    out["resumed early"] = {"plan": resumed.plan.to_dict(), "as_planned": resumed.session.stats.get("as_planned"),
                            "saved_iteration": saved["iteration"]}
    return out


def sparse_refused(rank: int, world: int) -> dict[str, str]:
    """Sparse gradients (an nn.Embedding(sparse=True)) through the hook and through the optimizer: what is raised."""
    out = {}
    emb = torch.nn.Embedding(10, 4, sparse=True)
    ddp = DDP(emb, find_unused_parameters=True)
    ddp.register_comm_hook(ct.CasyncState(codec="onebit"), ct.comm_hook)
    try:
        ddp(torch.tensor([1, 2])).sum().backward()
    except Exception as exc:
        out["hook"] = f"{type(exc).__name__}: {exc}"
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = ct.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), emb.named_parameters())
    try:
        emb(torch.tensor([1, 2])).sum().backward()
    except Exception as exc:
        out["optimizer"] = f"{type(exc).__name__}: {exc}"
    opt.close()
    return out


def mismatched_plans(rank: int, world: int, setting: str = "codec") -> Any:
    """Rank 0 asks for onebit, the others for topk: the first compressed step must fail on every rank; or
    (``setting``) the ranks differ in a setting outside the plan, found when casync's groups form."""
    other = {"codec": {"codec": "topk:ratio=0.1"}, "transport": {"transport": "gloo"}, "start_iter": {"start_iter": 3}}
    state = ct.CasyncState(**{"codec": "onebit", "timeout_s": 20, **(other[setting] if rank else {})})
    start = time.monotonic()
    try:
        train(mlp(), rank, range(4), state)
    except Exception as exc:
        return {"kind": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start,
                "iteration": state.iter}
    return {"kind": None}


def dies(rank: int, world: int, group_timeout: float = 8.0) -> Any:
    """The last rank exits abruptly before step 3's backward; the others must raise within the group timeout."""
    state = ct.CasyncState(codec="onebit", timeout_s=group_timeout)
    ddp, opt, _ = train(mlp(), rank, range(3), state)
    x, y = batch(3, rank)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    if rank == world - 1:
        os._exit(3)
    start = time.monotonic()
    try:
        loss.backward()
    except Exception as exc:
        return {"kind": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start,
                "error": type(state.error).__name__}
    return {"kind": None}


def fail_encodes() -> None:
    """From now on every encode of this process's executors raises ("encode failed on purpose")."""
    import casync.engines.executor as executor

    real = executor.run_node

    def failing(attrs: Any, *args: Any, **kwargs: Any) -> Any:
        if attrs["op"] == "encode":
            raise RuntimeError("encode failed on purpose")
        return real(attrs, *args, **kwargs)

    executor.run_node = failing


def op_fails(rank: int, world: int, flags: str, where: str = "encode", group_timeout: float = 30.0) -> Any:
    """In step 3 (compressed, over the gloo group) rank 1 fails: its encodes raise (``where="encode"``), or its
    hook raises as DDP hands it the first bucket (``"hook"``).  Every rank must fail at once naming that failure,
    not at the group's timeout.  Rank 1's process stays (as a script that catches the error would) until the
    others have failed, each leaving a file in ``flags``: its exit would close the connections, which the others
    would also notice at once, without knowing why."""
    import casync.torch.hook as hook

    state = ct.CasyncState(codec="onebit", transport="gloo", timeout_s=group_timeout)
    ddp, opt, _ = train(mlp(), rank, range(3), state)
    if rank == 1 and where == "encode":
        fail_encodes()
    elif rank == 1:
        def refuse(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("the hook failed on purpose")

        hook.HookSession._provide = refuse
    x, y = batch(3, rank)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    start = time.monotonic()
    try:
        loss.backward()
    except Exception as exc:
        out = {"kind": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start,
               "error": type(state.error).__name__}
    else:
        out = {"kind": None}
    open(os.path.join(flags, f"rank{rank}"), "w").close()
    deadline = time.monotonic() + 2 * group_timeout
    while rank == 1 and len(os.listdir(flags)) < world and time.monotonic() < deadline:
        time.sleep(0.05)
    return out


def dies_in_forward(rank: int, world: int, transport: str = "gloo") -> Any:
    """Rank 1 dies in its forward pass at step 3 (a script that lets the exception end its process); the others are
    in step 3's compressed sync, waiting for its payloads or for peers that wait for them.  Each must fail within
    seconds with a WorkerLostError naming worker:1, not the peer that noticed first."""
    state = ct.CasyncState(codec="onebit", transport=transport, timeout_s=30.0)
    ddp, opt, _ = train(mlp(), rank, range(3), state)
    x, y = batch(3, rank)
    start = time.monotonic()
    try:
        if rank == 1:
            raise RuntimeError("the forward pass failed on purpose")
        torch.nn.functional.mse_loss(ddp(x), y).backward()
    except Exception as exc:
        if rank == 1:
            os._exit(1)  # the process ends with its exception: its sockets close
        return {"kind": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start,
                "lost": getattr(exc, "lost", None)}
    return {"kind": None}


def uneven_join(rank: int, world: int, batches: list[int], codec: str = "none", check_every: int = 10,
                static_graph: bool = False) -> dict[str, Any]:
    """DDP's ``join()`` with uneven inputs (rank r has ``batches[r]`` batches), plain and with casync's hook of
    ``codec``: each run's final parameters, the loss of each step, and the steps casync counted."""
    out: dict[str, Any] = {}
    for run in ("plain", "casync"):
        model = mlp()
        ddp = DDP(model, bucket_cap_mb=0.004, static_graph=static_graph)
        state = None
        if run == "casync":
            state = ct.CasyncState(codec=codec, transport="gloo", check_every=check_every)
            ddp.register_comm_hook(state, ct.comm_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        losses = []
        with ddp.join():
            for step in range(batches[rank]):
                x, y = batch(step % 4, rank)  # a few batches seen again: a loss that falls when training works
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        out[run] = {"params": params(model), "losses": losses}
        if state is not None:
            out[run]["steps"] = state.iter
            state.close()
    return out


def nonfinite(rank: int, world: int) -> dict[str, Any]:
    """NaN in rank 0's gradient at step 3: propagated bit-identically to every rank; under 'skip' the step
    is voided on every rank (zeros) and the residuals stay as they were."""
    out = {}
    for mode in ("propagate", "skip"):
        model = DDP(GradientModel(SHAPES), bucket_cap_mb=0.008)
        state = ct.CasyncState(codec="onebit", nonfinite=mode)
        model.register_comm_hook(state, ct.comm_hook)
        seen = []
        for step in range(5):
            grads = step_grads(world, step)[rank]
            if step == 3 and rank == 0:
                grads["big"][7] = np.nan
            model.zero_grad(set_to_none=False)
            before = {k: v.copy() for k, v in state.runner.residuals.items()} if state.runner else {}
            model({n: torch.from_numpy(g) for n, g in grads.items()}).backward()
            seen.append({n: p.grad.numpy().copy() for n, p in model.module.named_parameters()})
            if step == 3:
                after = state.runner.residuals
                out[f"{mode}_residuals_kept"] = before.keys() == after.keys() and all(
                    np.array_equal(before[k], after[k]) for k in before)
                out[f"{mode}_skipped"] = state.session.stats["skipped"]
        out[mode] = seen
    return out


def skip_in_warmup(rank: int, world: int) -> list[tuple[int, bool, float, Any]]:
    """nonfinite="skip" with a NaN in rank 0's batch at a warm-up iteration (1) and a compressed one (4): per
    iteration, whether a gradient is NaN, the sum of |gradient| and the hook's ``skipped``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    state = ct.CasyncState(codec="onebit", nonfinite="skip", start_iter=3)
    ddp = DDP(model)
    ddp.register_comm_hook(state, ct.comm_hook)
    out = []
    for step in range(5):
        ddp.zero_grad()
        x = torch.ones(2, 4)
        if rank == 0 and step in (1, 4):
            x[0, 0] = float("nan")
        ddp(x).sum().backward()
        grad = model.weight.grad
        out.append((step, bool(torch.isnan(grad).any()), float(grad.abs().sum()), state.session.stats.get("skipped")))
    return out


def drift(rank: int, world: int) -> Any:
    """Rank 1 changes a parameter after step 3: the replica check at step 4 must fail on every rank."""
    state = ct.CasyncState(codec="onebit", check_every=4, timeout_s=20)
    ddp, opt, _ = train(mlp(), rank, range(4), state)
    if rank == 1:
        with torch.no_grad():
            next(ddp.module.parameters())[0, 0] += 1.0
    try:
        run_steps(ddp, opt, rank, range(4, 6))
    except Exception as exc:
        return {"kind": type(exc).__name__, "message": str(exc), "iteration": state.iter}
    return {"kind": None}


def frozen_after_wrapping(rank: int, world: int) -> dict[str, Any]:
    """A layer frozen after DDP wrapped the model (DDP keeps it in its buckets; find_unused_parameters=True, as
    plain DDP then needs): the hook trains on.  A checkpoint resumed with that layer frozen before wrapping
    (DDP leaves it out): refused, naming it."""
    import copy

    def run(ddp: DDP, steps: range) -> None:
        opt = torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad], lr=0.05)
        run_steps(ddp, opt, rank, steps)

    out: dict[str, Any] = {}
    model = mlp()
    ddp = DDP(model, bucket_cap_mb=0.004, find_unused_parameters=True)
    model[0].requires_grad_(False)
    state = ct.CasyncState(codec="onebit", timeout_s=15)
    ddp.register_comm_hook(state, ct.comm_hook)
    run(ddp, range(4))
    out["after_wrap"] = {"iteration": state.iter, "params": params(model)}
    saved = copy.deepcopy({"model": model.state_dict(), "casync": state.state_dict()})
    for when in ("after", "before"):
        resumed = mlp()
        resumed.load_state_dict(saved["model"])
        if when == "before":
            resumed[0].requires_grad_(False)
        ddp = DDP(resumed, bucket_cap_mb=0.004, find_unused_parameters=True)
        resumed[0].requires_grad_(False)
        restored = ct.CasyncState(codec="onebit", timeout_s=15)
        restored.load_state_dict(saved["casync"])
        ddp.register_comm_hook(restored, ct.comm_hook)
        start = time.monotonic()
        try:
            run(ddp, range(4, 6))
            out[when] = {"iteration": restored.iter}
        except ValueError as exc:
            out[when] = {"error": str(exc), "elapsed": time.monotonic() - start}
    return out


def loaded_on_some_ranks(rank: int, world: int, mode: str = "rank 0 only") -> Any:
    """A checkpoint loaded on rank 0 only (or, ``mode``, another one on rank 1): a clear error on every rank at
    the first sync, not a timeout."""
    import copy

    config = dict(codec="onebit", timeout_s=20)
    ddp, opt, _ = train(mlp(), rank, range(3), ct.CasyncState(**config))
    saved = copy.deepcopy(ddp._comm_hooks[0][1].state_dict())
    if mode == "other" and rank == 1:
        saved["iteration"] += 1
    restored = ct.CasyncState(**config)
    if mode == "other" or rank == 0:
        restored.load_state_dict(saved)
    start = time.monotonic()
    try:
        train(mlp(), rank, range(3, 5), restored)
    except Exception as exc:
        return {"kind": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start}
    return {"kind": None}


def late_open(rank: int, world: int, steps: int = 5, delay: float = 0.15) -> dict[str, Any]:
    """The hook opens each compressed step on its background thread (posting the receives off backward's thread);
    here that thread opens them ``delay`` s late, so the buckets backward hands over meanwhile wait for it.  The
    gradients must be those of a prompt open, and one long-lived thread serves every step."""
    import threading

    from casync.torch.hook import HookSession
    from casync.torch.runner import PlanRunner

    real_begin, real_provide = PlanRunner.begin, HookSession._provide
    early: list[bool] = []

    def provide(self: Any, ctx: Any, *args: Any) -> None:
        early.append(not ctx.begun)
        real_provide(self, ctx, *args)

    out: dict[str, Any] = {}
    for late in (False, True):
        PlanRunner.begin = (lambda self, step: (time.sleep(delay), real_begin(self, step))[1]) if late else real_begin
        HookSession._provide = provide
        early.clear()
        try:
            model = DDP(GradientModel(SHAPES), bucket_cap_mb=0.008)
            state = ct.CasyncState(check_every=0, strategy="ring", codec="onebit")
            model.register_comm_hook(state, ct.comm_hook)
            seen = []
            for step in range(steps):
                model.zero_grad(set_to_none=False)
                model({n: torch.from_numpy(g) for n, g in step_grads(world, step)[rank].items()}).backward()
                seen.append({n: p.grad.numpy().copy() for n, p in model.module.named_parameters()})
            threads = [t.name for t in threading.enumerate() if t.name.startswith("casync-step")]
            state.close()
            time.sleep(0.2)
            left = [t.name for t in threading.enumerate() if t.name.startswith("casync-step")]
        finally:
            PlanRunner.begin, HookSession._provide = real_begin, real_provide
        out["late" if late else "prompt"] = {"grads": seen, "handed_before_open": sum(early),
                                             "provides": len(early), "threads": threads, "left": left}
    return out
