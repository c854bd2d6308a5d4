"""Bytes a run puts on the wire per step, counted on each rank and summed over the ranks at the end.

casync's configurations count what their sends really carried (the hook session's or the optimizer's ``stats``
of each finished step); their uncompressed warm-up steps, DDP's allreduce and fp16 hooks, and PowerSGD count as a
ring all-reduce of their payload, as the bench counts them (all ranks together send ``2 (N-1)`` times it):
4 bytes per gradient element, 2 with fp16, PowerSGD's own element count of each step (its P and Q and the
tensors it leaves uncompressed).  The floor sends nothing.  A casync optimizer without ``stats`` (OneBitAdam) counts
its plan's sends in the steps it runs compressed (its ``compressing`` before the step) and an all-reduce in the
others; one that says neither leaves the count unknown (None).
"""
from __future__ import annotations

from typing import Any

from ..baselines import NO_COMMUNICATION
from ..hooks import is_hook


class WireCounter:
    """This rank's bytes per step of one run (:meth:`step` after each step), summed over the ranks by
    :meth:`totals` (a collective: every rank calls it)."""

    def __init__(self, config: Any, holder: Any, numel: int, world: int):
        self.variant, self.holder, self.world = config.variant, holder, world
        self.optimizer = config.optimizer is not None
        self.share = 2 * (world - 1) / world  # of a ring all-reduce's payload, sent by each rank
        self.dense = self.share * 4 * numel
        self.total: float | None = 0.0
        self.last: float | None = 0.0
        self.seen_step: Any = None
        self.powersgd_after = 0
        self.compressing: bool | None = None

    def before(self) -> None:
        """Note whether the coming step runs compressed, where the optimizer says so only beforehand."""
        if self.optimizer and getattr(self.holder, "stats", None) is None:
            self.compressing = getattr(self.holder, "compressing", None)

    def _casync(self) -> float | None:
        holder = self.holder.session if is_hook(self.variant or "") else self.holder
        stats = getattr(holder, "stats", None) if holder is not None else None
        if stats is None and self.optimizer:
            plan = getattr(holder, "plan", None)
            if self.compressing is None or plan is None:
                return None
            return plan.wire_bytes() / self.world if self.compressing else self.dense
        if stats and "sent_bytes" in stats and stats.get("step") != self.seen_step:
            self.seen_step = stats.get("step")
            return float(stats["sent_bytes"])
        return self.dense  # the hook's uncompressed warm-up (an all-reduce on casync's group)

    def _bytes(self) -> float | None:
        if self.optimizer or is_hook(self.variant or ""):
            return self._casync()
        if self.variant == "ddp-fp16":
            return self.dense / 2
        if self.variant == NO_COMMUNICATION:
            return 0.0
        if self.variant.startswith("ddp-powersgd"):
            after = self.holder.total_numel_after_compression
            step, self.powersgd_after = after - self.powersgd_after, after
            return self.share * 4 * step if step else self.dense  # before start_powerSGD_iter: an all-reduce
        return self.dense

    def step(self) -> None:
        """Count the step that just finished."""
        value = self._bytes()
        self.last = value
        self.total = None if value is None or self.total is None else self.total + value

    def totals(self) -> dict[str, float | None]:
        """``wire_bytes_per_step`` (the last step's, all ranks) and ``wire_bytes_total`` (the run's)."""
        import torch
        import torch.distributed as dist

        known = self.total is not None and self.last is not None
        both = torch.tensor([self.total or 0.0, self.last or 0.0, 0.0 if known else 1.0], dtype=torch.float64)
        dist.all_reduce(both)
        if both[2] > 0:
            return {"wire_bytes_per_step": None, "wire_bytes_total": None}
        return {"wire_bytes_per_step": float(both[1]), "wire_bytes_total": float(both[0])}
