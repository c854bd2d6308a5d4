"""Real training tasks on data every machine can have offline, for measuring what a codec costs in accuracy and
saves in time to accuracy (issue #43's time-to-accuracy mode builds on these).

* ``lm``: a word-level LSTM language model on the Python standard library's source (``casync.datasets.pycorpus``):
  embedding-heavy, trained with Adam, judged by validation loss (and perplexity);
* ``image``: a small convolutional network on Fashion-MNIST (``casync.datasets.idx_images``), trained with SGD and
  momentum, judged by top-1 accuracy on the 10,000 test images.

Each is a :class:`~casync.tasks.base.Task`: its data for one rank, its model, its optimizer, and its metric.
"""
from __future__ import annotations

from .base import Task


def get_task(name: str) -> Task:
    """The task registered as ``name``; a ValueError naming the ones there are."""
    tasks = _registry()
    if name not in tasks:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(sorted(tasks))}")
    return tasks[name]


def available_tasks() -> list[str]:
    return sorted(_registry())


def _registry() -> dict[str, Task]:
    """The built-in tasks (imported on first use: ``import casync.tasks`` loads no data code)."""
    from .image import IMAGE
    from .lm import LM

    return {task.name: task for task in (LM, IMAGE)}


__all__ = ["Task", "available_tasks", "get_task"]
