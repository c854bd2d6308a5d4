"""What the ranks of the OneBitAdam tests run (see ``harness.run_ranks``)."""
from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
import torch._dynamo  # noqa: F401  (preloaded with this module by the forkserver: a first optimizer imports it, 4 s)

import casync.torch as ct
from tests.torch.scenarios import batch, mlp, params

SHAPES = {"w": (3, 4), "b": (5,)}


class Tiny(torch.nn.Module):
    """Two parameters, different on every rank (``seed``): OneBitAdam broadcasts rank 0's."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(*SHAPES["w"], generator=g))
        self.b = torch.nn.Parameter(torch.randn(*SHAPES["b"], generator=g))


def grad_of(rank: int, step: int, name: str) -> np.ndarray:
    """The gradient rank ``rank`` feeds parameter ``name`` at ``step`` (the test recomputes it); ``b[0]`` is a dead
    unit, always 0 (its variance freezes at 0)."""
    g = np.random.default_rng([rank, step, len(name), ord(name[0])])
    grad = g.standard_normal(SHAPES[name]).astype(np.float32)
    if name == "b":
        grad[0] = 0
    return grad


def host(tensors: Any) -> dict[str, np.ndarray]:
    """(name, tensor) pairs as NumPy copies."""
    return {n: t.detach().cpu().numpy().copy() for n, t in tensors}


def rule(rank: int, world: int, runs: list[dict[str, Any]], steps: int, device: str = "cpu"
         ) -> list[dict[str, Any]]:
    """Per run (OneBitAdam keyword arguments): the starting parameters, then after every step the parameters,
    moments, residuals (from the collective state_dict) and whether that step was compressed.  ``device``: where
    the parameters, gradients and moments live (``"cuda"``: the rank's GPU)."""
    out = []
    for kwargs in runs:
        model = Tiny(seed=rank).to(device)
        opt = ct.OneBitAdam(model.named_parameters(), check_every=1, **kwargs)
        start = host(model.named_parameters())
        record = []
        for step in range(steps):
            compressing = opt.compressing
            for name, p in model.named_parameters():
                p.grad = torch.from_numpy(grad_of(rank, step, name)).to(device)
            opt.step()
            state = opt.state_dict()
            moments = state["optimizer"]["state"]
            index = {n: i for i, n in enumerate(state["optimizer"]["param_groups"][0]["param_names"])}
            record.append({
                "compressing": compressing, "stats": dict(opt.stats), "params": host(model.named_parameters()),
                "m": host((n, moments[i]["exp_avg"]) for n, i in index.items()),
                "v": host((n, moments[i]["exp_avg_sq"]) for n, i in index.items()),
                "residuals": {role: {n: t.numpy().copy() for n, t in r.items()}
                              for role, r in state["casync"]["residuals"].items()}})
        out.append({"start": start, "record": record, "plan": opt.plan.to_dict()})
        opt.close()
    return out


def resume(rank: int, world: int, steps: int = 6, warmup: int = 2, stops: tuple[int, ...] = (1, 4)
           ) -> dict[str, Any]:
    """Straight training (an LR schedule halving every 2 steps), and the same resumed from checkpoints taken after
    each of ``stops`` steps (one in the warm-up, one in the compression phase); then a checkpoint loaded with
    another warm-up length; and a replica that drifts."""
    def make(seed: int, k: int = warmup, exact: bool = False) -> tuple[torch.nn.Module, ct.OneBitAdam, Any]:
        model = mlp(seed)
        opt = ct.OneBitAdam(model.named_parameters(), lr=0.01, warmup_steps=k, weight_decay=0.01, bucket_bytes=4096,
                            exact_variance=exact)
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    def run(model: torch.nn.Module, opt: ct.OneBitAdam, scheduler: Any, span: range) -> None:
        for step in span:
            x, y = batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            scheduler.step()

    model, opt, scheduler = make(seed=0)
    saved = {}
    for step in range(steps):
        run(model, opt, scheduler, range(step, step + 1))
        if step + 1 in stops:
            file = io.BytesIO()  # through a file, read back as torch.load(weights_only=True) allows
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": scheduler.state_dict()}, file)
            file.seek(0)
            saved[step + 1] = torch.load(file, weights_only=True)
    straight = params(model)
    residual_roles = sorted(saved[max(stops)]["opt"]["casync"]["residuals"])
    opt.close()
    resumed = {}
    for stop, checkpoint in saved.items():
        model, opt, scheduler = make(seed=99)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
        scheduler.load_state_dict(checkpoint["sched"])
        run(model, opt, scheduler, range(stop, steps))
        resumed[stop] = params(model)
        opt.close()
    def refusal(**settings: Any) -> str | None:
        """What loading the last checkpoint into a OneBitAdam built with other ``settings`` says (None: loaded)."""
        _, other, _ = make(seed=0, **settings)
        try:
            other.load_state_dict(saved[max(stops)]["opt"])
            return None
        except ValueError as exc:
            return str(exc)
        finally:
            other.close()

    mismatch = refusal(k=warmup + 1)
    mismatch_exact = refusal(exact=True)  # a checkpoint without exact_variance, loaded with it
    model, drifting, scheduler = make(seed=0)  # a replica that drifts (rank 1 changes a weight): named at the check
    drifted = None
    try:
        run(model, drifting, scheduler, range(2))
        if rank == 1:
            with torch.no_grad():
                model[0].weight[0, 0] += 1
        run(model, drifting, scheduler, range(2, 11))  # the check every 10 steps (check_every's default)
    except Exception as exc:
        drifted = f"{type(exc).__name__}: {exc}"
    drifting.close()
    return {"straight": straight, "resumed": resumed, "roles": residual_roles, "mismatch": mismatch,
            "mismatch_exact": mismatch_exact, "drifted": drifted}


def least_squares(rank: int, world: int, runs: dict[str, dict[str, Any]], steps: int = 300, dim: int = 64,
                  rows: int = 256, scale: float = 1.0, noise: float = 0.1) -> dict[str, list[float]]:
    """Each rank's least-squares problem (its own rows of one linear model, weights ``scale * N(0, 1)``, plus
    ``noise``), minibatches of 16: per run, the loss on the rank's full data after every step.  ``runs``: name ->
    ``{"adam": OneBitAdam kwargs}`` or ``{"plain": DistributedOptimizer kwargs}`` (wrapping torch.optim.Adam)."""
    g = torch.Generator().manual_seed(7)
    truth = scale * torch.randn(dim, 1, generator=g)
    mine = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(rows, dim, generator=mine)
    y = x @ truth + noise * torch.randn(rows, 1, generator=mine)
    out = {}
    for name, spec in runs.items():
        torch.manual_seed(0)
        model = torch.nn.Linear(dim, 1)
        if "adam" in spec:
            opt = ct.OneBitAdam(model.named_parameters(), **spec["adam"])
        else:
            lr = spec["plain"].pop("lr")
            opt = ct.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=lr), model.named_parameters(),
                                          **spec["plain"])
        order = torch.Generator().manual_seed(1000 + rank)
        losses = []
        for _ in range(steps):
            pick = torch.randint(0, rows, (16,), generator=order)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[pick]), y[pick]).backward()
            opt.step()
            with torch.no_grad():
                losses.append(torch.nn.functional.mse_loss(model(x), y).item())
        out[name] = losses
        opt.close()
    return out
