"""The garbage collector in the processes casync owns: what set-up built is taken out of its full passes.

A Ray actor or an engine's rank process holds a large, long-lived heap once it is set up (Ray's own objects, the
plan, the executor's schedule), and CPython's full collection traverses all of it whenever enough objects were
allocated since the last one.  Measured on a 2-core host, the four ResNet-50 actors of a ring/onebit sync each ran
a full collection of 48-127 ms inside the same sync, which took 200-270 ms instead of about 80; when that happens
depends on how many objects earlier syncs allocated, so any change to them moves the stall.  ``gc.freeze`` after
set-up leaves that heap out of every later pass (objects a step allocates are still collected).
"""
from __future__ import annotations

import gc


def freeze_setup_heap() -> int:
    """Collect what set-up left over, then freeze every object this process holds now (``gc.freeze``); returns
    how many objects are frozen.  Only for processes casync owns: a training script's process is its own."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
