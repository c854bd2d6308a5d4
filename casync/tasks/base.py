"""What a task gives a training run: data for one rank, a seeded model, its optimizer, and how it is judged."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Task:
    """A training task.  ``load(path)`` reads its data (a folder of its kind; None: the default set) once per
    process; ``model(data, seed)`` builds the ``torch.nn.Module`` (seeded: every rank builds the same);
    ``optimizer(params, lr)`` the optimizer; ``batches(data, rank, world, batch_size, seed)`` an endless
    iterator of ``(inputs, targets)``; ``loss(model, inputs, targets)`` the training loss; ``evaluate(model,
    data)`` the validation metric, where ``higher_is_better`` says which way is better."""

    name: str
    metric: str
    higher_is_better: bool
    load: Callable[[Any], Any]
    model: Callable[[Any, int], Any]
    optimizer: Callable[[Any, float], Any]
    batches: Callable[..., Any]
    loss: Callable[[Any, Any, Any], Any]
    evaluate: Callable[[Any, Any], float]
    defaults: dict[str, Any] = field(default_factory=dict)  # lr, batch_size, steps: tuned on the uncompressed run
