"""``DistributedOptimizer``'s steps with ``delayed_update`` (CD-SGD; the update rules are :mod:`casync.torch.delayed`'s).

Each step's sync runs on the runner's lane as a :class:`~casync.torch.delayed.Flight`, behind the step before it,
while the script computes the next step's gradients; ``step()`` of step t+1 collects step t's synced gradient and
applies it.  A mixin of :class:`~casync.torch.optimizer.DistributedOptimizer` (its attributes: ``_sync``,
``_params``, ``_delayed``, ``_flights``, ``_flats``, ``_local``, ``_lock``, ``optimizer``)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..errors import SyncError
from ..transport.torchdist import as_sync_error
from .delayed import Flight, Pending


class DelayedSteps:
    """The delayed-update half of ``DistributedOptimizer`` (see the module docstring)."""

    _sync: Any
    _params: list
    _delayed: Any
    _flights: list
    _flats: dict
    _local: Any
    _lock: Any
    optimizer: Any

    def _fly(self, flight: Flight) -> Pending:
        """On the lane, a delayed step: open it (once the step before it is done there), run it, commit its
        residuals and copy its synced gradient out of the runner's buffers (the next step writes there)."""
        runner = self._sync.runner
        flight.open(runner)
        outcome = runner.run()
        runner.commit(outcome)
        grads = {}
        for name, p in self._params:
            bucket, member = self._sync.plan.locate(name)
            grads[name] = torch.from_numpy(outcome.results[bucket.name][member.offset:member.stop].copy()).view(p.shape)
        return Pending(outcome.step, grads, {"step": outcome.step, "sent_bytes": outcome.sent_bytes,
                                             "raw_bytes": outcome.raw_bytes, "skipped": False, "full": outcome.full,
                                             "nonfinite": outcome.nonfinite})

    def _synchronize_delayed(self) -> None:
        """:meth:`synchronize` with ``delayed_update`` (holding the lock; this step's gradients are handed over)."""
        sync = self._sync
        local = None
        if self._delayed.compensation is not None:  # x_t^i: what this rank hands to the sync, for the local step
            local = {}
            for name, p in self._params:
                bucket, member = sync.plan.locate(name)
                local[name] = torch.from_numpy(self._flats[bucket.name][member.offset:member.stop].copy()).view(p.shape)
        try:
            self._collect(keep=1)
        except BaseException as exc:
            self._reset()
            raise sync.fail(as_sync_error(exc, f"step {sync.iter - 1}")) from exc
        changed = self._changed()
        if changed:  # the step is in flight alike on every rank; the gradients are left as they are
            self._reset()
            raise RuntimeError(f"the gradients of {changed[:4]} were changed after backward but before synchronize() "
                               "(e.g. by clip_grad_norm_): with delayed_update, call opt.step() (or synchronize()) "
                               "right after backward; clip after synchronize(), which writes the update step() applies")
        if self._delayed.pending is not None:
            self._delayed.write_grads()
            self.stats = self._delayed.pending.stats
        self._local = local
        self._reset()
        self._synchronized = True

    def _collect(self, keep: int) -> None:
        """Wait for the delayed steps in flight but the newest ``keep``; the update they produced becomes pending."""
        while len(self._flights) > keep:
            flight = self._flights.pop(0)
            pending = flight.background.result(2 * self._sync.timeout_s + 30)
            if self._delayed.pending is not None:
                raise SyncError(f"step {pending.step}'s update arrived while step {self._delayed.pending.step}'s is "
                                "still pending: call step() once per synchronize()")
            self._delayed.pending = pending

    def _apply_delayed(self, closure: Callable[[], float] | None) -> Any:
        """The pending update: back to the kept w_t (compensation), the wrapped optimizer's step, the replica check."""
        pending = self._delayed.pending
        if pending is None:
            return None
        self._delayed.restore()
        result = self.optimizer.step(closure)
        self._delayed.pending = None
        applied = pending.step + 1
        if self._sync.check_every and applied % self._sync.check_every == 0:
            try:
                self._check_replicas(applied)
            except BaseException as exc:
                raise self._sync.fail(exc)
        return result

    def _settle_in_flight(self, misuse: str) -> None:
        """Wait for the step in flight (holding ``_lock``); ``misuse`` is raised between backward and step()."""
        if self._step is not None or self._synchronized:
            raise RuntimeError(misuse)
        try:
            self._collect(keep=0)
        except BaseException as exc:
            raise self._sync.fail(as_sync_error(exc, f"step {self._sync.iter - 1}")) from exc

    def apply_pending(self) -> bool:
        """``delayed_update``: wait for the last step's sync and apply its update now (with compensation, from the
        kept w_t); e.g. before evaluating or at the end of training.  Collective; returns whether there was one."""
        if self._delayed is None:
            raise RuntimeError("apply_pending() is for delayed_update=True: without it every step() applies its own "
                               "update")
        with self._lock:
            self._settle_in_flight("apply_pending() between backward and step(): call it after step()")
            if self._delayed.pending is None:
                return False
            self._delayed.write_grads()
            self._apply_delayed(None)
            return True

    def _delayed_state_dict(self) -> dict[str, Any]:
        """casync's state dict, the update in flight, the kept w_t and every rank's local step (collective)."""
        with self._lock:
            self._settle_in_flight("state_dict() with delayed_update between backward and step(): call it after step()")
            delayed = self._delayed.state()
            if self._delayed.compensation is not None:
                group = self._sync.ensure_group()
                mine = {n: t.detach().cpu().clone() for n, t in (self._delayed.local or {}).items()}
                delayed["local"] = {f"worker:{r}": part for r, part in enumerate(
                    group.gather_object(mine, "gathering the local steps for state_dict()"))}
            return {"casync": self._sync.state_dict(), "delayed": delayed}

