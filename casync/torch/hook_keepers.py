"""DGC's keepers inside the DDP comm hook: each bucket's gradients changed in place before the hook syncs them.

DDP hands the hook one bucket at a time.  Momentum correction works per parameter, so each bucket is corrected
as it comes and synced at once.  Local clipping needs the norm of the rank's whole gradient: with
``dgc_clip_norm`` every bucket of the iteration is held (its future returned unfinished) until DDP hands over
the last, then all are clipped and corrected together and synced in DDP's order, each held future completing
with its bucket's result.  The sync then no longer overlaps backward: the price of clipping by the global norm.
"""
from __future__ import annotations

import gc
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from ..training.dgc import check_no_momentum
from .keepers import LocalKeepers

#: (bucket, its buffer, parameter names, offsets) -> the bucket's future: the hook's sync of one bucket
Dispatch = Callable[[dist.GradBucket, torch.Tensor, list[str], list[int]], torch.futures.Future]


def finite(arrays: Any) -> bool:
    """Whether every value of the step's synced results is finite (alike on every rank: they hold the same)."""
    return all(bool(np.isfinite(np.asarray(a)).all()) for a in arrays)


def check_model_optimizers(module: torch.nn.Module) -> None:
    """Momentum correction: every optimizer holding ``module``'s parameters must have no momentum of its own
    (found by a scan of live objects, once, as the hook finds its DDP module)."""
    ids = {id(p) for p in module.parameters()}
    for obj in gc.get_objects():
        if isinstance(obj, torch.optim.Optimizer) and any(id(p) in ids for g in obj.param_groups for p in g["params"]):
            check_no_momentum(obj, f"the {type(obj).__name__} optimizing the DDP model")


class BucketSnapshot:
    """What the hook reads of a DDP ``GradBucket``, taken during DDP's call: DDP hands the hook a reference to a
    C++ object that lives only for that call, and a held bucket is synced in a later one."""

    def __init__(self, bucket: dist.GradBucket):
        self._index, self._last = bucket.index(), bucket.is_last()
        self._buffer, self._params, self._grads = bucket.buffer(), list(bucket.parameters()), list(bucket.gradients())

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        return self._grads


class HookKeepers:
    """The keepers' step in the hook for one DDP module (see the module docstring)."""

    def __init__(self, keepers: LocalKeepers, shapes: dict[str, tuple[int, ...]]):
        self.keepers = keepers
        self.shapes = shapes  # parameter -> shape
        self.held: list[tuple[BucketSnapshot, torch.Tensor, list[str], list[int], torch.futures.Future]] = []

    def _views(self, buffer: torch.Tensor, names: list[str], offsets: list[int]) -> list[tuple[str, torch.Tensor]]:
        flat = buffer.view(-1)
        out = []
        for name, offset in zip(names, offsets):
            shape = self.shapes[name]
            out.append((name, flat[offset:offset + int(np.prod(shape, dtype=np.int64))].view(shape)))
        return out

    def __call__(self, bucket: dist.GradBucket, buffer: torch.Tensor, names: list[str], offsets: list[int],
                 dispatch: Dispatch) -> torch.futures.Future:
        """Change the bucket's gradients in DDP's buffer, then sync it (with clipping: once the last is in)."""
        if not self.keepers.needs_all:
            with torch.no_grad():
                self.keepers.apply(self._views(buffer, names, offsets))
            return dispatch(bucket, buffer, names, offsets)
        held = torch.futures.Future()
        self.held.append((BucketSnapshot(bucket), buffer, names, offsets, held))
        if not bucket.is_last():
            return held
        buckets, self.held = self.held, []
        with torch.no_grad():
            self.keepers.apply([v for b, buf, n, o, _ in buckets for v in self._views(buf, n, o)])
        for b, buf, n, o, future in buckets[:-1]:
            _chain(dispatch(b, buf, n, o), future)
        b, buf, n, o, _ = buckets[-1]
        return dispatch(b, buf, n, o)

    def drop(self) -> None:
        """Forget held buckets (the hook failed: DDP is unusable)."""
        self.held = []


def _chain(source: torch.futures.Future, target: torch.futures.Future) -> None:
    """Complete ``target`` with ``source``'s value or error."""
    def done(fut: torch.futures.Future) -> None:
        try:
            value = fut.value()
        except Exception as exc:  # noqa: BLE001 - handed on as it is
            target.set_exception(exc)
            return
        target.set_result(value)

    source.add_done_callback(done)
