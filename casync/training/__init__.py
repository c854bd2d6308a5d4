"""Data-parallel training through casync: :class:`Trainer` and its per-step records."""
from .options import TrainOptions
from .records import History, StepRecord
from .trainer import Trainer

__all__ = ["History", "StepRecord", "TrainOptions", "Trainer"]
