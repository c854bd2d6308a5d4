"""DGC's and CD-SGD's accuracy keepers in ``casync.torch``: their options, and DGC's steps on a rank's gradient.

:class:`KeeperOptions` is checked once (with the Trainer's checks, ``casync.training.options.check_keepers``),
compared across ranks and kept in checkpoints.  :class:`LocalKeepers` holds one rank's DGC state and changes the
gradient this rank hands to the sync, in place, in this order (Lin et al. 2018, sections 3.2-3.3):

1. local gradient clipping (``dgc_clip_norm=c``): where the global L2 norm ``‖g‖`` of the rank's gradient (all
   the parameters it syncs in the step) exceeds ``c / sqrt(N)`` (N ranks), ``g <- g * (c / sqrt(N)) / ‖g‖``;
2. momentum correction (``momentum_correction=m``): ``u <- m*u + g``, and ``u`` is synced in place of ``g`` (error
   feedback then accumulates ``u``, DGC's ``v += u``); the optimizer applies the synced ``u`` without momentum.

After a step: momentum-factor masking (``momentum_masking=True``) sets ``u = 0`` where the rank's error-feedback
residual is zero, i.e. where its last step sent the accumulated value (only after steps synced with the plan's
sparse codec; uncompressed steps send everything, and mask nothing, as momentum SGD); a step voided for NaN/Inf,
or whose synced result holds NaN/Inf (a GradScaler then skips it), leaves ``u`` as it was before the step (not
with ``delayed_update``, whose NaN/Inf reach the parameters: it takes ``nonfinite="propagate"`` only).  The
shared pieces are ``casync.training.dgc``'s, the Trainer's own.

So that a step can be voided without copying ``u`` first, each parameter has two momentum buffers: a step writes
the new ``u`` into the one its step before last used (``MomentumCorrection.correct_into``, which also writes it
into the gradient, in cache-sized blocks) and keeps the old one as it was; voiding swaps them back.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import torch

from casync.primitives.codecs import get_codec

from ..training.dgc import MomentumCorrection, clip_by_global_norm, dgc_codecs
from ..training.options import check_keepers

#: options a DDP comm hook refuses, and why
HOOK_REFUSED = {
    "delayed_update": "a DDP comm hook cannot delay an update across iterations: DDP waits for every bucket's future "
                      "before backward() returns and the optimizer then applies that iteration's gradient; use "
                      "casync.torch.DistributedOptimizer(delayed_update=True) (without DDP)",
    "local_compensation": "CD-SGD's local update compensation needs the delayed update, which a DDP comm hook cannot "
                          "do (DDP applies each iteration's own synced gradient); use "
                          "casync.torch.DistributedOptimizer(delayed_update=True, local_compensation=eta)",
    "full_sync_every": "CD-SGD's periodic full-precision correction is DistributedOptimizer's "
                       "(casync.torch.DistributedOptimizer(full_sync_every=k)); the hook's full-precision warm-up "
                       "is CasyncState(start_iter=K)",
}


def refuse_in_hook(options: dict[str, Any]) -> None:
    """Raise for a delayed-update or CD-SGD option given to ``CasyncState`` (popped from ``options`` when it is
    set to its default, so passing ``delayed_update=False`` is harmless)."""
    for name, why in HOOK_REFUSED.items():
        if name in options:
            value = options.pop(name)
            if value not in (None, False):
                raise ValueError(f"CasyncState({name}={value!r}) is refused: {why}")


@dataclass(frozen=True)
class KeeperOptions:
    """The accuracy keepers a ``CasyncState`` / ``DistributedOptimizer`` runs (every rank alike).

    ``dgc_clip_norm``: DGC's local clipping threshold before the N^-1/2 scaling (None: off).
    ``momentum_correction``, ``momentum_masking``, ``warmup_steps``, ``warmup_start_ratio``: DGC's, as the
    Trainer's.  ``full_sync_every``, ``delayed_update``, ``local_compensation``: CD-SGD's (DistributedOptimizer
    only; see :mod:`casync.torch.delayed`)."""

    dgc_clip_norm: float | None = None
    momentum_correction: float | None = None
    momentum_masking: bool = False
    warmup_steps: int = 0
    warmup_start_ratio: float = 0.25
    full_sync_every: int | None = None
    delayed_update: bool = False
    local_compensation: float | None = None

    def __post_init__(self) -> None:
        check_keepers(self.momentum_correction, self.momentum_masking, self.warmup_steps, self.warmup_start_ratio,
                      self.delayed_update, self.full_sync_every)
        for name in ("dgc_clip_norm", "local_compensation"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number or None, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.local_compensation is not None and not self.delayed_update:
            raise ValueError("local_compensation stands in for the update still in flight: it needs "
                             "delayed_update=True")

    def config(self) -> dict[str, Any]:
        """The options as plain data (what ranks compare and what a checkpoint records)."""
        return asdict(self)

    def check_codec(self, codec: Any, error_feedback: Any) -> None:
        """Before any plan exists (the DDP hook builds its plan in its second iteration): a fixed ``codec`` must
        suit masking (sparse, with error feedback) and the warm-up (sparse, with a ratio); the plan's buckets are
        checked again once it exists (:meth:`warmup_codecs`)."""
        if not (self.momentum_masking or self.warmup_steps):
            return
        c = get_codec(None if codec == "none" else codec)
        if self.momentum_masking and (not c.sparse or error_feedback is False):
            raise ValueError(f"momentum_masking needs sparse codecs (topk, randomk) with error feedback; got codec {c} "
                             f"and error_feedback={error_feedback!r}")
        if self.warmup_steps and not (c.sparse and hasattr(c, "ratio")):
            raise ValueError(f"warmup_steps needs a sparse codec with a ratio (topk, randomk); got codec {c}")

    def warmup_codecs(self, plan: Any) -> dict[str, Any]:
        """Check the DGC options against ``plan``'s codecs (the Trainer's check); the codecs, by key, that the
        sparsity warm-up thins out."""
        return dgc_codecs(plan, self.momentum_masking, self.warmup_steps)


def check_saved_config(saved: Mapping[str, Any] | None, options: KeeperOptions) -> None:
    """A checkpoint's keeper options (None: saved before there were any) must be these."""
    now = options.config()
    saved = dict(KeeperOptions().config(), **(saved or {}))
    differ = sorted(k for k in now if saved.get(k) != now[k])
    if differ:
        raise ValueError("the checkpoint was saved with other accuracy keepers: " + ", ".join(
            f"{k}={saved.get(k)!r} (now {now[k]!r})" for k in differ) + "; pass the saved ones to resume exactly")


class LocalKeepers:
    """One rank's DGC state (momentum buffers) and its steps on the gradient it syncs (module docstring)."""

    def __init__(self, options: KeeperOptions, params: Mapping[str, torch.Tensor], workers: int):
        self.options = options
        self.workers = workers
        self.momentum = (MomentumCorrection(options.momentum_correction, {n: p.detach() for n, p in params.items()})
                         if options.momentum_correction is not None else None)
        self._before: dict[str, torch.Tensor] | None = None  # u before the step in progress (to void it): the
        # buffers the step replaced, by parameter (momentum correction writes the new u into a spare)
        self._spares: dict[str, torch.Tensor] = {}  # buffers no one reads: the next step's new u goes there
        self.voidable = True  # whether a step can be voided (keep u from before it); not with delayed updates
        self._buckets: tuple[Any, dict] | None = None  # (plan, its buckets as MomentumCorrection.mask_sent wants)

    @property
    def active(self) -> bool:
        """Whether the keepers change the gradient at all."""
        return self.options.dgc_clip_norm is not None or self.momentum is not None

    @property
    def needs_all(self) -> bool:
        """Whether every gradient of a step must be in before any is changed (clipping by the global norm)."""
        return self.options.dgc_clip_norm is not None

    def apply(self, views: Sequence[tuple[str, torch.Tensor]]) -> float | None:
        """Clip (over all of ``views`` at once) then momentum-correct, in place: each view (parameter name, its
        gradient shaped like the parameter) becomes what the rank syncs.  Returns the norm before clipping."""
        norm = None
        if self.options.dgc_clip_norm is not None:
            norm = clip_by_global_norm([v for _, v in views], self.options.dgc_clip_norm, self.workers)
        if self.momentum is not None:
            if self.voidable and self._before is None:
                self._before = {}
            for name, view in views:
                out = None
                if self._before is not None and name not in self._before:  # the new u into a spare buffer: the
                    self._before[name] = self.momentum.buffers[name]  # old one is kept as it was, not copied
                    out = self._spares.pop(name, None)
                    if out is None:
                        out = torch.empty_like(self._before[name])
                if out is None:
                    view.copy_(self.momentum.correct(name, view))
                else:
                    self.momentum.correct_into(name, view, out)
        return norm

    def finish(self, voided: bool = False, residuals: Mapping[str, Any] | None = None, actor: str = "",
               plan: Any = None) -> None:
        """End a step: ``voided`` puts ``u`` back as it was before it; otherwise, with masking and the
        ``residuals`` of a step synced with ``plan``'s codec, zero ``u`` where ``actor``'s residual is zero."""
        before, self._before = self._before, None
        if self.momentum is None:
            return
        if voided:
            for name, u in (before or {}).items():  # the step's buffers become spares again
                self._spares[name], self.momentum.buffers[name] = self.momentum.buffers[name], u
            return
        self._spares.update(before or {})  # the buffers from before the step: the next step writes there
        if self.options.momentum_masking and residuals is not None:
            if self._buckets is None or self._buckets[0] is not plan:
                self._buckets = (plan, {b.name: (list(b.partitions), b.numel, [(m.spec.name, m.offset, m.stop)
                                                                                for m in b.members])
                                        for b in plan.buckets})
            self.momentum.mask_sent(residuals, actor, self._buckets[1])

    def state(self) -> dict[str, torch.Tensor]:
        """This rank's momentum buffers (CPU copies; empty without momentum correction)."""
        if self.momentum is None:
            return {}
        return {n: u.detach().cpu().clone() for n, u in sorted(self.momentum.buffers.items())}

    def load(self, saved: Mapping[str, Any], who: str) -> None:
        """Restore :meth:`state`'s output (``who`` names the rank in errors)."""
        if self.momentum is None:
            if saved:
                raise ValueError(f"the checkpoint has momentum-correction buffers for {who} but momentum_correction "
                                 "is off")
            return
        missing = sorted(set(self.momentum.buffers) - set(saved))
        extra = sorted(set(saved) - set(self.momentum.buffers))
        if missing or extra:
            raise ValueError(f"momentum buffers of {who}: the checkpoint lacks {missing[:4]} and has {extra[:4]} "
                             "besides the parameters synced now")
        for name, value in saved.items():
            u = self.momentum.buffers[name]
            value = torch.as_tensor(value)
            if tuple(value.shape) != tuple(u.shape) or value.dtype != torch.float32:
                raise ValueError(f"momentum buffer of {who} for {name!r}: expected float32 {tuple(u.shape)}, got "
                                 f"{value.dtype} {tuple(value.shape)}")
            u.copy_(value)
