"""Data-parallel training through casync: :class:`Trainer` and its per-step records.

``Trainer`` (which imports Ray) is imported on first use: ``casync.torch`` shares this package's Ray-free
modules (``dgc``, ``full_sync``, ``options``) inside torchrun processes that never start Ray."""
from .options import TrainOptions
from .records import History, StepRecord


def __getattr__(name: str):
    """``casync.training.Trainer`` without importing Ray until it is used."""
    if name == "Trainer":
        from .trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'casync.training' has no attribute {name!r}")


__all__ = ["History", "StepRecord", "TrainOptions", "Trainer"]
