"""``DistributedOptimizer``: casync for scripts without DDP, as Horovod's ``hvd.DistributedOptimizer``.

    opt = casync.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            model.named_parameters(), strategy="ring", codec="onebit")
    loss.backward()
    opt.synchronize()                       # optional: wait for the synced gradients (e.g. to clip them)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()                              # waits if synchronize() was not called

The plan fuses the parameters (in reverse registration order, as backward usually produces them) into buckets
of ``bucket_bytes``.  A hook on every parameter (``register_post_accumulate_grad_hook``) copies its gradient into
its bucket once backward has accumulated it ``backward_passes_per_step`` times; a complete bucket starts syncing
at once on a background thread while backward goes on.  ``synchronize()`` hands over what is missing
(parameters that got no gradient count as zeros), waits, and writes the mean (or sum) into every ``.grad``.
With gradient accumulation the summed local gradient of the ``k`` passes is synchronized (scale the loss by
``1/k`` for a mean over passes, as with Horovod).  Parameters, frozen ones too, are broadcast from rank 0 at
construction.

The accuracy keepers (:mod:`casync.torch.keepers`, :mod:`casync.torch.delayed`): DGC's local clipping and
momentum correction change each gradient as it is copied into its bucket (with clipping, the buckets go to the
sync once every gradient of the step is in), masking follows each compressed step, the sparsity warm-up thins
the sparse codecs of the first steps; CD-SGD's full-precision steps (``start_iter``, ``full_sync_every``) run the
plan's uncompressed twin with the residuals kept, and ``delayed_update`` / ``local_compensation`` apply each
step's update one step late.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from ..errors import NonFiniteGradientError
from ..plan.assemble import make_buckets
from ..plan.specs import TensorSpec
from ..training.dgc import check_no_momentum, step_codecs
from ..training.full_sync import is_full_sync
from ..transport.torchdist import as_sync_error
from .delayed import DelayedUpdate, Flight
from .delayed_steps import DelayedSteps
from .hook_keepers import finite
from .keepers import KeeperOptions
from .plans import SyncOptions, plan_for_buckets
from .runner import Background, StepOutcome
from .state import SyncState


_SAMPLES = 8  # values of each gradient kept to find a gradient changed between backward and synchronize()


def _stride(numel: int) -> int:
    return max(1, numel // _SAMPLES)


class DistributedOptimizer(DelayedSteps, torch.optim.Optimizer):
    """Wraps ``optimizer`` (sharing its ``param_groups`` and ``state``, so LR schedulers work on it) and
    synchronizes the gradients of ``named_parameters`` with a casync plan.

    ``strategy``, ``codec``, ``error_feedback`` and ``**plan_options`` (``partitions``, ``two_way``, ``op``,
    ``seed``, ``bucket_bytes``; ``cluster``/``profile``/``ready_times`` with ``"auto"``) are
    :func:`casync.build_plan`'s; ``min_compress_bytes``: smaller buckets go uncompressed; ``nonfinite``:
    ``"propagate"`` (default), ``"skip"`` (``step()`` then skips the update on every rank) or ``"raise"``
    (``synchronize()`` raises :class:`~casync.NonFiniteGradientError` on every rank, nothing changed).
    ``process_group``, ``timeout_s``, ``check_every``, ``transport``, ``compute_threads`` as for
    :class:`~casync.torch.CasyncState`.

    Accuracy keepers (every rank passes the same).  DGC: ``dgc_clip_norm`` (each rank's gradient clipped to a
    global L2 norm of ``dgc_clip_norm / sqrt(N)`` before anything else), ``momentum_correction=m`` (each rank syncs
    ``u = m*u + g``; the wrapped optimizer must have no momentum), ``momentum_masking`` (``u = 0`` where the rank's
    residual is zero after a compressed step), ``warmup_steps`` / ``warmup_start_ratio`` (the Trainer's sparsity
    warm-up, by steps done).  CD-SGD: ``start_iter=K`` (the first K steps sync uncompressed), ``full_sync_every=k``
    (steps k-1, 2k-1, ... sync uncompressed; the residuals are kept for the next compressed step), ``delayed_update``
    and ``local_compensation=eta_local`` (the update rules are :mod:`casync.torch.delayed`'s; ``nonfinite`` must be
    ``"propagate"``).  Construct it at the same point on every rank (it creates casync's process groups).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]],
                 strategy: Any = "ring", codec: Any = "onebit", error_feedback: bool | str = "auto",
                 backward_passes_per_step: int = 1, min_compress_bytes: int = 0, nonfinite: str = "propagate", *,
                 process_group: Any = None, timeout_s: float = 60.0, check_every: int = 10,
                 transport: str = "direct", compute_threads: int = 1, dgc_clip_norm: float | None = None,
                 momentum_correction: float | None = None, momentum_masking: bool = False, warmup_steps: int = 0,
                 warmup_start_ratio: float = 0.25, start_iter: int = 0, full_sync_every: int | None = None,
                 delayed_update: bool = False, local_compensation: float | None = None, **plan_options: Any):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
        named = list(named_parameters)
        if not all(isinstance(n, str) and isinstance(p, torch.Tensor) for n, p in named):
            raise TypeError("named_parameters must yield (name, tensor) pairs, e.g. model.named_parameters()")
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError(f"named_parameters has duplicate names {sorted({n for n in names if names.count(n) > 1})[:4]}")
        known = {id(p) for _, p in named}
        unnamed = [tuple(p.shape) for g in optimizer.param_groups for p in g["params"] if id(p) not in known]
        if unnamed:
            raise ValueError(f"the optimizer has parameters (shapes {unnamed[:4]}) that are not in named_parameters")
        options = SyncOptions.make(strategy, codec, error_feedback, min_compress_bytes, nonfinite, plan_options,
                                   fixed_buckets=False)
        keepers = KeeperOptions(dgc_clip_norm, momentum_correction, momentum_masking, warmup_steps, warmup_start_ratio,
                                full_sync_every, delayed_update, local_compensation)
        if momentum_correction is not None:
            check_no_momentum(optimizer, "the wrapped optimizer")
        if delayed_update and nonfinite != "propagate":
            raise ValueError(f"delayed_update takes nonfinite='propagate' only (got {nonfinite!r}): a step voided for "
                             "NaN/Inf would have to be undone after the next step had started from its residuals")
        self.optimizer = optimizer
        # Optimizer's own set-up (step hooks) without re-adding the groups: param_groups, state and defaults
        # are the wrapped optimizer's (properties below), also after its load_state_dict() replaces them
        torch.optim.Optimizer.__setstate__(self, {})
        self.backward_passes_per_step = backward_passes_per_step
        self._sync = SyncState(options, process_group, timeout_s, transport, check_every, compute_threads, start_iter,
                               keepers)
        self._sync.full_steps = bool(start_iter or full_sync_every)
        group = self._sync.ensure_group()
        self._params = [(n, p) for n, p in named if p.requires_grad]
        if not self._params:
            raise ValueError("named_parameters has no parameter that requires a gradient")
        with torch.no_grad():
            for _, p in named:  # every replica starts from rank 0's parameters, frozen ones too
                host = p.detach().cpu().contiguous() if p.device.type != "cpu" or not p.is_contiguous() else p.data
                group.broadcast_(host, "broadcasting parameters from rank 0")
                if host is not p.data:
                    p.data.copy_(host)
        specs = [TensorSpec(n, tuple(p.shape)) for n, p in reversed(self._params)]
        bucket_bytes = options.bucket_bytes if options.bucket_bytes is not None else 25 << 20
        buckets = [[(s.name, s.shape) for s in group_] for group_ in make_buckets(specs, bucket_bytes)]
        self._sync.plan = plan_for_buckets(options, buckets, group.world)
        self._warmup = keepers.warmup_codecs(self._sync.plan)
        self._by_name = dict(self._params)
        self._keepers = self._sync.make_keepers(self._by_name)
        self._keepers.voidable = not delayed_update
        self._delayed = DelayedUpdate(self._params, local_compensation) if delayed_update else None
        self._flights: list[Flight] = []  # delayed steps whose update was not collected yet, oldest first
        self._local: dict[str, torch.Tensor] | None = None  # x_t^i of the step synchronize() handed over
        self._lock = threading.Lock()
        self._reset()
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in self._params]
        self.skipped = False  # whether the last synchronize() voided its step (nonfinite="skip")
        self.stats: dict[str, Any] = {}  # the last step: bytes sent, NaN/Inf reports

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    # -- gradients as backward produces them ---------------------------------------------------------------------
    def _reset(self) -> None:
        self._passes: dict[str, int] = {}
        self._flats: dict[str, np.ndarray] = {}
        self._remaining: dict[str, int] = {}
        self._background: Background | None = None
        self._step: int | None = None
        self._synchronized = False
        self._taken: dict[str, tuple[int, int] | None] = {}  # parameter -> (id, version) of the .grad synced
        self._held: list[str] = []  # complete buckets waiting for the rest (clipping by the global norm)
        self._flight: Flight | None = None

    def _hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def ready(param: torch.Tensor) -> None:
            if param.grad is not None and param.grad.layout != torch.strided:
                raise TypeError(f"parameter {name!r} has a {param.grad.layout} gradient; casync syncs dense gradients "
                                "only (e.g. nn.Embedding(sparse=False))")
            with self._lock:
                if self._synchronized:  # a new step's gradients: the last synchronize() had no step() after it
                    self._synchronized = False  # (GradScaler.step skips step() after an overflow)
                count = self._passes.get(name, 0) + 1
                if count > self.backward_passes_per_step:
                    raise RuntimeError(f"parameter {name!r} got a gradient {count} times since the last step(); "
                                       f"backward_passes_per_step is {self.backward_passes_per_step}: call step() (or "
                                       "synchronize()) after that many backward passes")
                self._passes[name] = count
                if count == self.backward_passes_per_step:
                    self._put(name, param.grad)
        return ready

    def _open(self) -> None:
        """Open a step: the runner (first time: shared memory, the plan check), the replica check when due."""
        sync = self._sync
        sync.check_usable()
        first = sync.runner is None
        try:
            sync.ensure_runner()
            sync.check_plan_once()
            step = sync.iter
            if first or (self._delayed is None and sync.check_every and step % sync.check_every == 0):
                self._check_replicas(step)  # (delayed: step() checks, once the update is applied)
            full = is_full_sync(step, self._sync.keeper_options.full_sync_every, sync.start_iter)
            codecs = step_codecs(step, full, sync.plan.codecs, self._warmup, sync.keeper_options.warmup_start_ratio,
                                 sync.keeper_options.warmup_steps)[0]
            if self._delayed is None:
                sync.runner.begin(step, full=full, codecs=codecs)
        except BaseException as exc:  # the ranks no longer agree on what comes next: unusable
            raise sync.fail(exc)
        self._step = step
        if self._delayed is None:
            self._background = Background(sync.runner.run, f"casync-step-{step}", lane=sync.runner.lane)
            return
        sync.iter = step + 1  # the step's update is collected later; the next step opens behind it on the lane
        flight = self._flight = Flight(step, full, codecs)
        flight.background = Background(lambda: self._fly(flight), f"casync-step-{step}", lane=sync.runner.lane)
        self._flights.append(flight)

    def _check_replicas(self, step: int) -> None:
        """The replica check (collective): of w_t, not a rank's local step (local_compensation)."""
        tensors = self._delayed.replica_tensors() if self._delayed is not None else [p for _, p in self._params]
        by_name = {n: t for (n, _), t in zip(self._params, tensors)}
        self._sync.check_params(step, [by_name[t.name] for t in self._sync.plan.tensors])

    def _put(self, name: str, grad: torch.Tensor | None) -> None:
        """Copy one parameter's gradient into its plan bucket; hand a complete bucket to the runner."""
        if self._step is None:
            self._open()
        plan = self._sync.plan
        bucket, member = plan.locate(name)
        flat = self._flats.get(bucket.name)
        if flat is None:
            flat = self._flats[bucket.name] = np.empty(bucket.numel, np.float32)
            self._remaining[bucket.name] = len(bucket.members)
        target = flat[member.offset:member.stop]
        if grad is None:
            target[...] = 0
            self._taken[name] = None
        else:
            target[...] = grad.detach().to(device="cpu", dtype=torch.float32).reshape(-1).numpy()
            # what synchronize() checks the .grad against: the same tensor, unchanged (its version counter, and a
            # few of its values: GradScaler's unscale_ does not count as a version)
            self._taken[name] = (id(grad), grad._version, target[::_stride(target.size)][:_SAMPLES].copy())
        if self._keepers.active and not self._keepers.needs_all:  # momentum correction, parameter by parameter
            with torch.no_grad():
                self._keepers.apply([(name, torch.from_numpy(target).view(member.spec.shape))])
        self._remaining[bucket.name] -= 1
        if self._remaining[bucket.name] == 0:
            self._complete(bucket.name)

    def _complete(self, bucket: str) -> None:
        """A bucket's gradients are all in: sync it; with clipping, once every bucket is (then clip and correct)."""
        if not self._keepers.needs_all:
            return self._provide(bucket)
        self._held.append(bucket)
        plan = self._sync.plan
        if len(self._held) < len(plan.buckets):
            return None
        with torch.no_grad():
            self._keepers.apply([(m.spec.name, torch.from_numpy(self._flats[b.name][m.offset:m.stop]).view(m.spec.shape))
                                 for b in plan.buckets for m in b.members])
        held, self._held = self._held, []
        for name in held:
            self._provide(name)
        return None

    def _provide(self, bucket: str) -> None:
        if self._flight is not None:
            self._flight.provide(self._sync.runner, bucket, self._flats[bucket])
        else:
            self._sync.runner.provide(bucket, self._flats[bucket])

    # -- synchronization ----------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for this step's synchronized gradients and write them into ``.grad`` (parameters without a
        gradient since the last step count as zeros).  Collective: every rank calls it once per step.  With
        ``delayed_update`` this step's gradients are handed over and the previous step's synced ones (the update
        ``step()`` applies) are written, if there is one."""
        with self._lock:
            if self._synchronized:
                return
            sync = self._sync
            try:
                for name, _ in reversed(self._params):
                    if self._passes.get(name, 0) < self.backward_passes_per_step:
                        self._passes[name] = self.backward_passes_per_step
                        self._put(name, self._by_name[name].grad)
                if self._delayed is not None:
                    return self._synchronize_delayed()
                outcome: StepOutcome = self._background.result(2 * sync.timeout_s + 30)
            except NonFiniteGradientError:
                self._keepers.finish(voided=True)
                self._reset()
                raise
            except BaseException as exc:
                self._reset()
                raise sync.fail(as_sync_error(exc, f"step {sync.iter}")) from exc
            if not outcome.skipped:
                sync.runner.commit(outcome)
            sync.iter = outcome.step + 1
            if self._keepers.momentum is not None:  # u back if the step was voided or NaN/Inf reached it; masking
                voided = outcome.skipped or not finite(outcome.results.values())
                self._keepers.finish(voided, None if outcome.full else sync.runner.residuals, sync.runner.actor,
                                     sync.plan)
            changed = self._changed()
            if changed:  # the step was synced (alike on every rank); the gradients are left as they are
                self._reset()
                raise RuntimeError(
                    f"the gradients of {changed[:4]} were changed after backward but before synchronize() (e.g. by "
                    "GradScaler.unscale_, a bare scaler.step(opt), or clip_grad_norm_); synchronize() would replace "
                    "them with the synced gradients of the values backward produced, and the change would be lost. "
                    "Call opt.synchronize() first: opt.synchronize(); scaler.unscale_(opt); clip; "
                    "with opt.skip_synchronize(): scaler.step(opt)")
            self.skipped = outcome.skipped
            self.stats = {"step": outcome.step, "sent_bytes": outcome.sent_bytes, "raw_bytes": outcome.raw_bytes,
                          "skipped": outcome.skipped, "full": outcome.full, "nonfinite": outcome.nonfinite}
            plan = sync.plan
            with torch.no_grad():
                for name, p in self._params:
                    bucket, member = plan.locate(name)
                    value = torch.from_numpy(outcome.results[bucket.name][member.offset:member.stop]).view(p.shape)
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    p.grad.copy_(value)
            self._reset()
            self._synchronized = True
        return None

    def _changed(self) -> list[str]:
        """Parameters whose ``.grad`` was replaced or changed in place since it was taken for the sync."""
        out, samples = [], []
        for name, p in self._params:
            taken, grad = self._taken.get(name), p.grad
            if taken is None:
                continue
            if grad is None or (id(grad), grad._version) != taken[:2]:
                out.append(name)
            else:
                flat = grad.detach().reshape(-1)
                samples.append((name, taken[2], flat[::_stride(flat.numel())][:_SAMPLES]))
        if samples:  # one copy to the host
            now = torch.cat([s.to(torch.float32) for _, _, s in samples]).cpu().numpy()
            at = 0
            for name, before, _ in samples:
                if not np.array_equal(before, now[at:at + before.size], equal_nan=True):
                    out.append(name)
                at += before.size
        return out

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Synchronize (unless :meth:`synchronize` already did for this step), then the wrapped optimizer's step;
        a step voided for NaN/Inf (``nonfinite="skip"``) is not applied."""
        if self._delayed is not None and closure is not None:
            raise ValueError("step(closure) with delayed_update: the closure's gradient would be taken at parameters "
                             "the delayed update has not reached; call backward() then step()")
        self.synchronize()
        self._synchronized = False
        if self._delayed is not None:
            result = self._apply_delayed(None)
            if self._local is not None:  # local update compensation: w_t - eta_local * x_t^i until step t's arrives
                self._delayed.step_locally(self._local)
                self._local = None
            return result
        if self.skipped:
            return None
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise ValueError("casync's plan is built when the DistributedOptimizer is made: add parameter groups to the "
                         "wrapped optimizer before wrapping it")

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Horovod's idiom (``synchronize(); ...; with opt.skip_synchronize(): opt.step()``): casync's ``step()``
        already never syncs twice, so this only checks that :meth:`synchronize` ran.  With a ``GradScaler``:
        ``opt.synchronize(); scaler.unscale_(opt); with opt.skip_synchronize(): scaler.step(opt)`` (a bare
        ``scaler.step(opt)`` unscales the local gradients, which ``step()`` then replaces with synced, scaled ones)."""
        if not self._synchronized:
            raise RuntimeError("skip_synchronize() without synchronize() first: the gradients are not synced")
        yield

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict plus casync's (plan, steps, every rank's residuals and momentum
        buffers; with ``delayed_update`` the update in flight, the kept w_t and every rank's local step);
        collective.  With ``delayed_update``, call it after ``step()`` (it waits for the step in flight)."""
        out = {"optimizer": self.optimizer.state_dict()}
        if self._delayed is None:
            return {**out, "casync": self._sync.state_dict()}
        return {**out, **self._delayed_state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (before the first step), checked against these parameters;
        with ``local_compensation``, after the model's parameters are loaded (it moves them to this rank's local
        step)."""
        if not isinstance(state_dict, dict) or "optimizer" not in state_dict or "casync" not in state_dict:
            raise ValueError("expected the output of DistributedOptimizer.state_dict() (keys 'optimizer' and "
                             "'casync')")
        if self._flights or self._delayed is not None and self._delayed.pending is not None:
            raise RuntimeError("load_state_dict() must come before the first step")
        self._sync.load_state_dict(state_dict["casync"])
        if self._sync.plan is None:
            raise ValueError("the casync state has no plan")
        self._sync.check_parameters({n: tuple(p.shape) for n, p in self._params})
        self._warmup = self._sync.keeper_options.warmup_codecs(self._sync.plan)
        self.optimizer.load_state_dict(state_dict["optimizer"])
        if self._delayed is not None:  # the update in flight; with compensation, this rank's local step again
            role = f"worker:{self._sync.ensure_group().rank}"
            saved = state_dict.get("delayed") or {}
            self._delayed.load(saved, (saved.get("local") or {}).get(role), role)

    @property
    def plan(self) -> Any:
        """The casync plan the gradients are synchronized with."""
        return self._sync.plan

    def close(self) -> None:
        """Remove the gradient hooks and release shared memory."""
        for handle in self._handles:
            handle.remove()
        self._sync.close()

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r}, plan={self._sync.plan!r})"

