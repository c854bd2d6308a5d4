"""scikit-learn's digits (1,797 8x8 images, shipped offline) as a data-parallel training job.

Picklable building blocks for :class:`casync.Trainer`: a held-out split, per-worker shards as PyTorch
``DataLoader``s, multi-million-parameter MLPs, the loss and an accuracy check.  Used by the CLI
(``casync train``), ``examples/train_digits.py`` and the tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

#: ``mlp``: casync's built-in model (64-2048-2048-10, 4.3M parameters; 94% of them in one layer).
#: ``mlp-deep``: 64-1024x4-10 (3.2M parameters spread over three 1M-parameter layers, so gradients
#: become ready bucket by bucket through the backward pass: the model that shows overlap).
MODEL_DIMS: dict[str, tuple[int, ...]] = {
    "mlp": (64, 2048, 2048, 10),
    "mlp-deep": (64, 1024, 1024, 1024, 1024, 10),
}


@lru_cache(maxsize=4)
def _split(test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the digits dataset needs scikit-learn: pip install 'casync[train]'") from exc
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def load_split(test_fraction: float = 0.2, seed: int = 0):
    """``(x_train, y_train, x_test, y_test)`` as torch tensors: pixels scaled to [0, 1], a fixed permutation."""
    import torch

    return tuple(torch.from_numpy(a.copy()) for a in _split(test_fraction, seed))


@dataclass(frozen=True)
class DigitsData:
    """``data_fn`` for the Trainer: worker ``rank`` gets every ``world_size``-th training image, batched by a
    ``DataLoader`` that reshuffles each epoch (from the torch RNG, which the trainer seeds and checkpoints).

    The training arrays (360 KiB) are loaded here and travel with the object, so workers need no scikit-learn.
    """

    batch_size: int = 32
    shuffle: bool = True
    test_fraction: float = 0.2
    seed: int = 0
    train: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size!r}")
        object.__setattr__(self, "train", _split(self.test_fraction, self.seed)[:2])

    def __call__(self, rank: int, world_size: int):
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        x, y = (torch.from_numpy(a.copy()) for a in self.train)
        shard = torch.arange(rank, len(y), world_size)
        return DataLoader(TensorDataset(x[shard], y[shard]), batch_size=self.batch_size, shuffle=self.shuffle,
                          drop_last=True)


@dataclass(frozen=True)
class DigitsMLP:
    """``model_fn`` for the Trainer: Linear+ReLU layers over ``dims`` (input 64 pixels, 10 classes)."""

    dims: tuple[int, ...] = MODEL_DIMS["mlp"]

    @classmethod
    def named(cls, name: str) -> "DigitsMLP":
        if name not in MODEL_DIMS:
            raise ValueError(f"unknown digits model {name!r}; choose one of {', '.join(MODEL_DIMS)}")
        return cls(MODEL_DIMS[name])

    def __call__(self):
        from torch import nn

        if self.dims == MODEL_DIMS["mlp"]:
            from ..plan.models import build_torch_model

            return build_torch_model("mlp")
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (a, b) in enumerate(zip(self.dims[:-1], self.dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(self.dims) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)


@dataclass(frozen=True)
class SGD:
    """``optimizer_fn``: ``torch.optim.SGD`` with these settings."""

    lr: float = 0.2
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __call__(self, params):
        import torch

        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


def cross_entropy(model, batch):
    """``loss_fn``: mean cross-entropy of the model's logits on ``(images, labels)``."""
    import torch.nn.functional as F

    x, y = batch
    return F.cross_entropy(model(x), y)


def accuracy(model, test_fraction: float = 0.2, seed: int = 0) -> float:
    """Fraction of the held-out images the model classifies correctly."""
    import torch

    _, _, x, y = load_split(test_fraction, seed)
    model.eval()
    with torch.no_grad():
        correct = (model(x).argmax(1) == y).sum().item()
    model.train()
    return correct / len(y)
