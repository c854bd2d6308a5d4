"""The Trainer tests' shared trainers: one pool per module (``tests/training/pool.py``)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def trainers(ray_local):
    """Trainers whose actors this module's tests share, closed when the module is done (before ``ray_local`` checks
    that every CPU is free again)."""
    from tests.training.pool import TrainerPool

    pool = TrainerPool()
    yield pool
    pool.close()
