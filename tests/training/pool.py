"""Trainers whose actors the tests of one module share (``Trainer.restart`` / ``Trainer.resume``).

Starting a Trainer's actors (a process each, importing torch and casync, setting up its data plane) costs 1.5-2.5
CPU-seconds an actor; a restart on running actors is what a fresh ``casync.Trainer`` with the same arguments gives,
bit for bit (``tests/training/test_restart.py``).  So a test asks the pool for a trainer with the arguments it would
have given ``casync.Trainer`` (or ``Trainer.load``) and gets an idle one of the same shape restarted, or a new one;
when the test is done the trainer goes back to the pool, or is closed if it can no longer train.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import casync
from casync.training.checkpoint import read_checkpoint


def _shape(workers: int, kwargs: dict[str, Any]) -> tuple:
    """What a restart cannot change: the actors (workers, dedicated servers) and their placement."""
    return workers, kwargs.get("servers") or 0, kwargs.get("cpus_per_worker", 1.0), kwargs.get("placement", "spread")


class TrainerPool:
    """Idle trainers by shape; :meth:`trainer` and :meth:`loaded` hand one out for a ``with`` block."""

    def __init__(self) -> None:
        self._idle: dict[tuple, list[casync.Trainer]] = {}

    def _take(self, shape: tuple, restart: Callable[[casync.Trainer], Any], new: Callable[[], casync.Trainer]):
        idle = self._idle.get(shape)
        if not idle:
            return new()
        trainer = idle.pop()
        try:
            restart(trainer)
        except BaseException:
            trainer.close()
            raise
        return trainer

    def start(self, *fns: Callable, **kwargs: Any) -> casync.Trainer:
        """``casync.Trainer(*fns, **kwargs)``, on an idle trainer's actors where one has the same shape."""
        return self._take(_shape(kwargs.get("workers", 4), kwargs), lambda t: t.restart(*fns, **kwargs),
                          lambda: casync.Trainer(*fns, **kwargs))

    def load(self, path: str | Path, *fns: Callable, **overrides: Any) -> casync.Trainer:
        """``casync.Trainer.load(path, *fns, **overrides)``, on an idle trainer's actors where one has the shape."""
        config = read_checkpoint(path).config
        saved = dict(config["options"], **config["plan_options"], **overrides)
        return self._take(_shape(config["workers"], saved), lambda t: t.resume(path, *fns, **overrides),
                          lambda: casync.Trainer.load(path, *fns, **overrides))

    def give_back(self, trainer: casync.Trainer) -> None:
        """Keep ``trainer`` for the next test if it can still train (its replicas are checked), else close it."""
        try:
            trainer.check_replicas()
        except casync.SyncError:
            trainer.close()
            return
        servers = len(trainer.plan.actors) - trainer.workers
        self._idle.setdefault(_shape(trainer.workers, dict(trainer.options.to_dict(), servers=servers)),
                              []).append(trainer)

    @contextmanager
    def trainer(self, *fns: Callable, **kwargs: Any) -> Iterator[casync.Trainer]:
        trainer = self.start(*fns, **kwargs)
        try:
            yield trainer
        finally:
            self.give_back(trainer)

    @contextmanager
    def loaded(self, path: str | Path, *fns: Callable, **overrides: Any) -> Iterator[casync.Trainer]:
        trainer = self.load(path, *fns, **overrides)
        try:
            yield trainer
        finally:
            self.give_back(trainer)

    def close(self) -> None:
        for trainers in self._idle.values():
            for trainer in trainers:
                trainer.close()
        self._idle.clear()
