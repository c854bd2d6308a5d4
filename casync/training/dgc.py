"""Deep Gradient Compression's worker-side tricks: momentum correction, momentum-factor masking, and the
sparsity warm-up schedule.  Error feedback itself (DGC's local gradient accumulation) is the plan's job."""
from __future__ import annotations

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


class MomentumCorrection:
    """Per-worker momentum ``u`` moved before compression (DGC): ``u = m*u + g`` is what gets synchronized.

    Since the sync is linear for lossless codecs, the average of the workers' ``u`` equals the momentum of
    the averaged gradient, so a momentum-free optimizer on the synced ``u`` reproduces momentum SGD.
    With a lossy codec the error-feedback residual accumulates ``u``, as DGC's ``v += u``.
    """

    def __init__(self, momentum: float, params: dict[str, torch.Tensor]):
        self.momentum = float(momentum)
        self.buffers = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}

    def correct(self, name: str, grad: torch.Tensor | None) -> torch.Tensor:
        """Fold this step's gradient (``None``: the parameter got none) into ``u`` and return ``u``."""
        u = self.buffers[name]
        u.mul_(self.momentum)
        if grad is not None:
            u.add_(grad.to(torch.float32))
        return u

    def mask(self, name: str, sent: np.ndarray) -> None:
        """Momentum-factor masking: forget the momentum of coordinates that were sent (``sent`` is flat bool)."""
        self.buffers[name].view(-1)[torch.from_numpy(sent)] = 0.0

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: u.numpy().copy() for name, u in self.buffers.items()}

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
