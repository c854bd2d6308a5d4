"""The arithmetic of ``casync.torch.OneBitAdam``: Adam's moments and update, in ``torch.optim.Adam``'s own float ops.

The warm-up steps are ``torch.optim.Adam`` (``AdamW`` with a weight decay) bit for bit on the averaged gradient:
the same operations in the same order (``lerp_`` for the momentum, ``mul_``/``addcmul_`` for the variance,
``addcdiv_`` for the update), so a run can be checked against PyTorch's own optimizer.  The compression steps
reuse the momentum rule on the local gradient and the update with the frozen variance.
"""
from __future__ import annotations

import math

import torch


def corrections(beta1: float, beta2: float, step: int, variance_step: int, bias_correction: bool
                ) -> tuple[float, float]:
    """``(1 - beta1**step, sqrt(1 - beta2**variance_step))``: Adam's bias corrections of the momentum at ``step``
    and of the variance last updated at ``variance_step`` (both 1 without ``bias_correction``, DeepSpeed's rule)."""
    if not bias_correction:
        return 1.0, 1.0
    return 1 - beta1 ** step, (1 - beta2 ** variance_step) ** 0.5


def update_moments_(exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, grad: torch.Tensor, beta1: float,
                    beta2: float) -> None:
    """A warm-up step's moments, in place: ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g*g`` (as Adam)."""
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)


def local_momentum(exp_avg: torch.Tensor, grad: torch.Tensor, beta1: float) -> torch.Tensor:
    """A compression step's local momentum ``b1*m + (1-b1)*g`` (a new tensor: ``m`` is replaced only by the
    synchronized value, once the sync succeeded)."""
    return exp_avg.lerp(grad, 1 - beta1)


def apply_update_(param: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, lr: float, eps: float,
                  weight_decay: float, correction1: float, correction2_sqrt: float) -> None:
    """``x = x*(1 - lr*wd)`` (decoupled weight decay, AdamW's), then
    ``x -= lr/correction1 * m / (sqrt(v)/correction2_sqrt + eps)``, in place."""
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    denom = (exp_avg_sq.sqrt() / correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-(lr / correction1))


def check_hyperparameters(lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                          where: str = "") -> None:
    """ValueError naming the first hyperparameter out of range (``where``: which parameter group)."""
    def number(name: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name}{where} must be a finite number, got {value!r}")
        return float(value)

    if number("lr", lr) < 0:
        raise ValueError(f"lr{where} must be >= 0, got {lr!r}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas{where} must be a pair (beta1, beta2), got {betas!r}")
    for i, beta in enumerate(betas):
        if not 0.0 <= number(f"betas[{i}]", beta) < 1.0:
            raise ValueError(f"betas[{i}]{where} must be in [0, 1), got {beta!r}")
    if number("eps", eps) <= 0:
        raise ValueError(f"eps{where} must be > 0 (it bounds the step where the frozen variance is 0), got {eps!r}")
    if number("weight_decay", weight_decay) < 0:
        raise ValueError(f"weight_decay{where} must be >= 0, got {weight_decay!r}")
