"""Deep Gradient Compression's worker-side tricks (Lin et al. 2018): local gradient clipping, momentum correction,
momentum-factor masking and the sparsity warm-up schedule.  Error feedback itself (DGC's local gradient
accumulation) is the plan's job.  Shared by the Ray Trainer and ``casync.torch`` (hook and DistributedOptimizer);
Ray-free, so torchrun processes import it without Ray."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch


def warmup_ratio(step: int, target: float, start: float, steps: int) -> float:
    """Density a sparse codec keeps at ``step``: ``start`` falling geometrically to ``target`` over ``steps``."""
    if step >= steps or start <= target:
        return target
    return float(start * (target / start) ** (step / steps))


def step_codecs(step: int, full: bool, codecs: dict, warmup: dict, start: float, steps: int) -> tuple[dict | None, float | None]:
    """This step's codec objects by key when the sparsity warm-up changes them (None: the plan's), and the
    density it keeps; every actor of a step computes the same (senders and receivers must agree)."""
    if full or not warmup:
        return None, None
    out, density = dict(codecs), None
    for key, codec in warmup.items():
        density = warmup_ratio(step, codec.ratio, start, steps)
        out[key] = type(codec)(**dict(codec.params(), ratio=density))
    return out, density


def dgc_codecs(plan: Any, momentum_masking: bool, warmup_steps: int) -> dict[str, Any]:
    """Check the DGC options against ``plan``'s codecs; returns the codecs (by key) the sparsity warm-up thins
    out (empty without ``warmup_steps``).  Masking reads sent coordinates off error-feedback residuals, so it
    needs sparse codecs with error feedback; the warm-up needs sparse codecs with a ``ratio``."""
    sparse = {key: c for key, c in plan.codecs.items() if c.sparse}
    used = {b.name: b.codec for b in plan.buckets}
    if momentum_masking:
        dense = [f"{name} ({c})" for name, c in used.items() if not c.sparse]
        if dense:
            raise ValueError(f"momentum_masking needs sparse codecs (topk, randomk); bucket(s) {dense[:3]} "
                             "use dense ones")
        if not plan.options["error_feedback"]:
            raise ValueError("momentum_masking reads the sent coordinates off error-feedback residuals: "
                             "error_feedback must be on")
    if warmup_steps:
        unusable = [str(c) for c in sparse.values() if not hasattr(c, "ratio")]
        if not sparse or unusable:
            raise ValueError(f"warmup_steps needs a sparse codec with a ratio (topk, randomk); the plan uses "
                             f"{sorted({str(c) for c in used.values()})}")
        return sparse
    return {}


def check_no_momentum(optimizer: torch.optim.Optimizer, what: str = "the optimizer") -> None:
    """Momentum correction moves momentum before compression: ``optimizer`` must have none of its own (SGD's
    ``momentum``, or the first ``betas`` of Adam-like optimizers), else momentum would be applied twice."""
    for group in optimizer.param_groups:
        betas = group.get("betas")
        if group.get("momentum") or (isinstance(betas, (tuple, list)) and betas and betas[0]):
            kind = f"momentum={group.get('momentum')}" if group.get("momentum") else f"betas={tuple(betas)}"
            raise ValueError(f"momentum_correction applies momentum before compression; {what} has momentum of its "
                             f"own ({kind}; it would be applied twice): use momentum=0 (plain SGD)")


def clip_by_global_norm(tensors: Sequence[torch.Tensor], clip_norm: float, workers: int) -> float:
    """DGC's local gradient clipping (section 3.3): scale this worker's gradients in place by
    ``threshold / norm`` when their global L2 norm exceeds ``threshold = clip_norm / sqrt(workers)`` (each worker's
    share of a global threshold, for workers with alike gradient distributions).  Returns the norm before
    clipping; a non-finite norm clips nothing (the NaN/Inf policy decides about such a step)."""
    if not tensors:
        return 0.0
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t, dtype=torch.float32)
                                                       for t in tensors])))
    threshold = clip_norm / math.sqrt(workers)
    if math.isfinite(norm) and norm > threshold:
        scale = threshold / norm
        for t in tensors:
            t.mul_(scale)
    return norm


def sent_mask(residuals: Mapping[str, np.ndarray], actor: str, bucket: str, partitions: Sequence[tuple[int, int]],
              numel: int) -> np.ndarray:
    """Where ``actor``'s error-feedback residuals of ``bucket`` are zero (flat bool): the coordinates whose
    accumulated value its last compressed step sent (keys ``"<actor>/<bucket>/<part>"``, the engines')."""
    sent = np.zeros(numel, dtype=bool)
    for part, (a, b) in enumerate(partitions):
        residual = residuals.get(f"{actor}/{bucket}/{part}")
        if residual is not None:
            np.equal(residual, 0, out=sent[a:b])
    return sent


#: elements per block of :meth:`MomentumCorrection.correct_into` (1 MiB of float32: the block of ``u``, of the
#: gradient and of the new ``u`` stay in a core's cache between the three passes over it)
MOMENTUM_BLOCK = 1 << 18


class MomentumCorrection:
    """Per-worker momentum ``u`` moved before compression (DGC): ``u = m*u + g`` is what gets synchronized.

    Since the sync is linear for lossless codecs, the average of the workers' ``u`` equals the momentum of
    the averaged gradient, so a momentum-free optimizer on the synced ``u`` reproduces momentum SGD.
    With a lossy codec the error-feedback residual accumulates ``u``, as DGC's ``v += u``.
    """

    def __init__(self, momentum: float, params: dict[str, torch.Tensor]):
        self.momentum = float(momentum)
        self.buffers = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}

    def correct(self, name: str, grad: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Fold this step's gradient (``None``: the parameter got none) into ``u`` and return ``u``.

        ``out``: a float32 tensor of ``u``'s shape to hold the new ``u`` (it becomes the buffer), leaving the old
        one as it was, so a caller that may void the step keeps it without copying it first (the same floats)."""
        u = self.buffers[name]
        if out is None:
            u.mul_(self.momentum)
        else:
            if out.shape != u.shape or out.dtype != torch.float32 or out.device != u.device:
                raise ValueError(f"momentum buffer {name!r}: out must be float32 {tuple(u.shape)} on {u.device}, "
                                 f"got {out.dtype} {tuple(out.shape)} on {out.device}")
            u = self.buffers[name] = torch.mul(u, self.momentum, out=out)
        if grad is not None:
            u.add_(grad.to(torch.float32))
        return u

    def correct_into(self, name: str, grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """:meth:`correct` with ``out`` becoming the buffer, and ``grad`` overwritten with the new ``u`` (what the
        rank then syncs), in blocks that stay in cache between the multiply, the add and the copy: the same floats
        as ``grad.copy_(correct(name, grad, out))`` (float32 ``m*u`` rounded, then ``+ grad`` rounded), with one
        pass over memory fewer than that and no pass over the old buffer but a read.  Falls back to that where
        the tensors are not float32, contiguous, on the CPU and apart."""
        u = self.buffers[name]
        flat = [t.detach().view(-1) if t.is_contiguous() else None for t in (u, grad, out)]
        if (any(f is None or f.device.type != "cpu" or f.dtype != torch.float32 for f in flat)
                or out.shape != u.shape or grad.shape != u.shape
                or len({f.untyped_storage().data_ptr() for f in flat}) < 3):
            return grad.copy_(self.correct(name, grad, out))
        old, g, new = (f.numpy() for f in flat)
        for start in range(0, old.size, MOMENTUM_BLOCK):
            stop = start + MOMENTUM_BLOCK
            block = new[start:stop]
            np.multiply(old[start:stop], np.float32(self.momentum), out=block)
            np.add(block, g[start:stop], out=block)
            g[start:stop] = block
        self.buffers[name] = out
        return out

    def mask(self, name: str, sent: np.ndarray) -> None:
        """Momentum-factor masking: forget the momentum of coordinates that were sent (``sent`` is flat bool)."""
        u = self.buffers[name]
        if u.device.type == "cpu" and u.is_contiguous():  # NumPy's masked copy: ~3x faster than torch's bool index
            np.copyto(u.detach().view(-1).numpy(), 0.0, where=sent)
        else:
            u.view(-1)[torch.from_numpy(sent).to(u.device)] = 0.0

    def mask_sent(self, residuals: Mapping[str, np.ndarray], actor: str,
                  buckets: Mapping[str, tuple[Sequence[tuple[int, int]], int, Sequence[tuple[str, int, int]]]]) -> None:
        """Mask every coordinate ``actor`` sent in its last compressed step (:func:`sent_mask`); ``buckets``:
        bucket -> (partitions, numel, members as (name, start, stop))."""
        for bucket, (partitions, numel, members) in buckets.items():
            sent = sent_mask(residuals, actor, bucket, partitions, numel)
            for name, start, stop in members:
                if name in self.buffers:
                    self.mask(name, sent[start:stop])

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: u.cpu().numpy().copy() for name, u in self.buffers.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if state.keys() != self.buffers.keys():
            raise ValueError(f"momentum-correction state has tensors {sorted(state)[:5]}..., "
                             f"expected {sorted(self.buffers)[:5]}...")
        for name, value in state.items():
            u = self.buffers[name]
            value = np.asarray(value, dtype=np.float32)
            if value.shape != tuple(u.shape):
                raise ValueError(f"momentum buffer {name!r}: expected shape {tuple(u.shape)}, got {value.shape}")
            u.copy_(torch.from_numpy(value.copy()))
