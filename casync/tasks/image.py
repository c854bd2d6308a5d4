"""The image task: a small convolutional network on Fashion-MNIST, SGD with momentum, top-1 test accuracy.

Two 5x5 convolutions (16 and 32 channels, each followed by 2x2 max pooling) feed a fully connected layer of
``HIDDEN`` units: that layer holds most of the parameters (1,568 x 2,048 of 3.3 M), so the model's compute is small
beside its gradient, as the communication-bound models of the seeds' papers.  Sized (``HIDDEN``, 4 images per rank)
so that DDP allreduce's step on 4 emulated nodes at 1 Gbit is >= 80 % sync (82 %: 206 ms against the 37 ms floor);
the learning rate, annealed by a cosine over the run, is the best of 0.02, 0.05, 0.1 for allreduce over 1,200 steps
(benchmarks/results/time_to_accuracy/tuning).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator

import numpy as np

from ..datasets.idx_images import FASHION_MNIST, ImageSet, load_images
from .base import Task

HIDDEN = 2048


@lru_cache(maxsize=2)
def load(path: Any = None) -> ImageSet:
    return load_images(path if path is not None else FASHION_MNIST)


def build_model(data: ImageSet, seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    height, width = data.x_train.shape[1:]
    flat = 32 * (height // 4) * (width // 4)
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(flat, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, data.classes))


def optimizer(params: Any, lr: float) -> Any:
    import torch

    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def _tensor(images: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(images.astype(np.float32)[:, None] / 255.0)


def batches(data: ImageSet, rank: int, world: int, batch_size: int, seed: int = 0) -> Iterator[tuple[Any, Any]]:
    """This rank's share of each epoch's seeded permutation of the training set, ``batch_size`` at a time."""
    import torch

    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(len(data.y_train))[rank::world]
        for start in range(0, len(order) - batch_size + 1, batch_size):
            take = order[start:start + batch_size]
            yield _tensor(data.x_train[take]), torch.from_numpy(data.y_train[take])
        epoch += 1


def loss(model: Any, inputs: Any, targets: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(model(inputs), targets)


def evaluate(model: Any, data: ImageSet) -> float:
    """Top-1 accuracy on the test images."""
    import torch

    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(data.y_test), 1000):
            x = _tensor(data.x_test[start:start + 1000])
            correct += int((model(x).argmax(1) == torch.from_numpy(data.y_test[start:start + 1000])).sum())
    model.train(was_training)
    return correct / len(data.y_test)


IMAGE = Task(name="image", metric="top-1 accuracy", higher_is_better=True, load=load, model=build_model,
             optimizer=optimizer, batches=batches, loss=loss, evaluate=evaluate,
             defaults={"lr": 0.05, "schedule": "cosine", "batch_size": 4})
