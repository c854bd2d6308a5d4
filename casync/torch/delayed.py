"""CD-SGD's one-step-delayed update and local update compensation, for ``DistributedOptimizer``.

The update rules, with the wrapped optimizer plain SGD of learning rate η (any optimizer applies ḡ_t as it would
apply a gradient), g_t^i rank i's gradient of step t, x_t^i what rank i hands to step t's sync (g_t^i, after DGC's
clipping and momentum correction where those are on) and ḡ_t the synced mean of the x_t^i:

* not delayed: g_t^i is computed at w_t, and ``step()`` of step t applies w_{t+1} = w_t - η ḡ_t.
* ``delayed_update=True``: step t's sync runs while step t+1's forward and backward run, so g_{t+1}^i is computed
  at w_t, which lacks ḡ_t; ``step()`` of step t+1 waits for ḡ_t and applies w_{t+1} = w_t - η ḡ_t.  The first
  ``step()`` applies nothing; :meth:`DistributedOptimizer.apply_pending` applies the last update in flight.
* ``local_compensation=η_l`` (with the delay): once ``step()`` of step t has set w_t, the rank keeps w_t and moves
  to w_t - η_l x_t^i (its own x_t^i stands in for the synced update still in flight); g_{t+1}^i is computed
  there.  ``step()`` of step t+1 puts the parameters back to the kept w_t, bit for bit, and applies ḡ_t:
  w_{t+1} = w_t - η ḡ_t.  Replicas therefore differ only by their local step; the replica check compares w_t.

State for an exact resume: the pending update (step t, ḡ_t), the kept w_t and every rank's x_t^i (the
optimizer's ``state_dict`` gathers them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch


@dataclass
class Pending:
    """A step whose sync has finished but whose update is not applied yet."""

    step: int
    grads: dict[str, torch.Tensor]  # the synced gradient per parameter (CPU float32, shaped like it)
    stats: dict[str, Any]


class DelayedUpdate:
    """The delayed update of one rank: the pending step, and with compensation the kept w_t and x_t^i."""

    def __init__(self, params: list[tuple[str, torch.Tensor]], compensation: float | None):
        self.params = params
        self.compensation = compensation
        self.pending: Pending | None = None
        self.base: dict[str, torch.Tensor] | None = None  # w_t, kept while the parameters hold the local step
        self.local: dict[str, torch.Tensor] | None = None  # x_t^i of that local step

    def replica_tensors(self) -> list[torch.Tensor]:
        """The parameters every rank holds alike (w_t, not the rank's local step), in ``params`` order."""
        if self.base is not None:
            return [self.base[n] for n, _ in self.params]
        return [p for _, p in self.params]

    def write_grads(self) -> None:
        """The pending update's synced gradient into every ``.grad``."""
        with torch.no_grad():
            for name, p in self.params:
                value = self.pending.grads[name]
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(value)

    def restore(self) -> None:
        """Back to the kept w_t, exactly (before the synced update is applied); nothing without a local step."""
        if self.base is None:
            return
        with torch.no_grad():
            for name, p in self.params:
                p.copy_(self.base[name])
        self.base = self.local = None

    def step_locally(self, local: dict[str, torch.Tensor]) -> None:
        """Keep w_t (the parameters now) and move to w_t - η_l x_t^i."""
        self.base = {name: p.detach().clone() for name, p in self.params}
        self.local = local
        self._move()

    def _move(self) -> None:
        with torch.no_grad():
            for name, p in self.params:
                p.copy_(self.base[name])
                p.add_(self.local[name].to(device=p.device, dtype=p.dtype), alpha=-self.compensation)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The pending step and update, the kept w_t (this rank's local step's x_t^i is gathered by the caller)."""
        pending = self.pending
        return {"step": pending.step if pending is not None else None,
                "grads": dict(pending.grads) if pending is not None else {},
                "base": {n: t.detach().cpu().clone() for n, t in self.base.items()} if self.base is not None else None}

    def load(self, saved: Mapping[str, Any], local: Mapping[str, Any] | None, who: str) -> None:
        """Restore :meth:`state` and this rank's x_t^i; the parameters (loaded from the model's checkpoint before)
        move to the kept w_t's local step again, bit for bit as before the save."""
        names = {n for n, _ in self.params}
        step = saved.get("step")
        if step is not None:
            grads = saved.get("grads") or {}
            _check(grads, self.params, f"the pending update (step {step})")
            self.pending = Pending(int(step), {n: torch.as_tensor(grads[n]).clone() for n in names}, {})
        base = saved.get("base")
        if base is None:
            return
        if self.compensation is None:
            raise ValueError("the checkpoint holds a local step (local_compensation) but local_compensation is off")
        if local is None:
            raise ValueError(f"the checkpoint has no local step for {who}")
        _check(base, self.params, "the kept parameters")
        _check(local, self.params, f"the local step of {who}")
        self.base = {n: torch.as_tensor(base[n]).to(device=p.device, dtype=p.dtype).clone() for n, p in self.params}
        self.local = {n: torch.as_tensor(local[n]).clone() for n in names}
        self._move()


def _check(saved: Mapping[str, Any], params: list[tuple[str, torch.Tensor]], what: str) -> None:
    names = {n for n, _ in params}
    if set(saved) != names:
        raise ValueError(f"{what}: the checkpoint names {sorted(set(saved) - names)[:4]} besides the parameters and "
                         f"lacks {sorted(names - set(saved))[:4]}")
    for name, p in params:
        shape = tuple(torch.as_tensor(saved[name]).shape)
        if shape != tuple(p.shape):
            raise ValueError(f"{what}: {name!r} has shape {shape} in the checkpoint, {tuple(p.shape)} now")


class Flight:
    """A delayed step in flight: its buckets go to the runner once the lane has opened the step (after the step
    before it finished there); until then they wait here."""

    def __init__(self, step: int, full: bool, codecs: dict[str, Any] | None):
        import threading

        self.step, self.full, self.codecs = step, full, codecs
        self.lock = threading.Lock()
        self.begun = False
        self.queued: list[tuple[str, Any]] = []
        self.background: Any = None  # casync.torch.runner.Background running it

    def provide(self, runner: Any, bucket: str, flat: Any) -> None:
        """Hand a bucket to the runner, or queue it until the step is open."""
        with self.lock:
            if not self.begun:
                self.queued.append((bucket, flat))
                return
        runner.provide(bucket, flat)

    def open(self, runner: Any) -> None:
        """On the lane: open the step, then hand over the buckets queued meanwhile."""
        runner.begin(self.step, full=self.full, codecs=self.codecs)
        with self.lock:
            self.begun = True
            queued, self.queued = self.queued, []
        for bucket, flat in queued:
            runner.provide(bucket, flat)
