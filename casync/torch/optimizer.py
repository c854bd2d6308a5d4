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
from ..transport.torchdist import as_sync_error
from .plans import SyncOptions, plan_for_buckets
from .runner import Background, StepOutcome
from .state import SyncState


_SAMPLES = 8  # values of each gradient kept to find a gradient changed between backward and synchronize()


def _stride(numel: int) -> int:
    return max(1, numel // _SAMPLES)


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer`` (sharing its ``param_groups`` and ``state``, so LR schedulers work on it) and
    synchronizes the gradients of ``named_parameters`` with a casync plan.

    ``strategy``, ``codec``, ``error_feedback`` and ``**plan_options`` (``partitions``, ``two_way``, ``op``,
    ``seed``, ``bucket_bytes``; ``cluster``/``profile``/``ready_times`` with ``"auto"``) are
    :func:`casync.build_plan`'s; ``min_compress_bytes``: smaller buckets go uncompressed; ``nonfinite``:
    ``"propagate"`` (default), ``"skip"`` (``step()`` then skips the update on every rank) or ``"raise"``
    (``synchronize()`` raises :class:`~casync.NonFiniteGradientError` on every rank, nothing changed).
    ``process_group``, ``timeout_s``, ``check_every``, ``transport``, ``compute_threads`` as for
    :class:`~casync.torch.CasyncState`.
    Construct it at the same point on every rank (it creates casync's process groups).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]],
                 strategy: Any = "ring", codec: Any = "onebit", error_feedback: bool | str = "auto",
                 backward_passes_per_step: int = 1, min_compress_bytes: int = 0, nonfinite: str = "propagate", *,
                 process_group: Any = None, timeout_s: float = 60.0, check_every: int = 10,
                 transport: str = "direct", compute_threads: int = 1, **plan_options: Any):
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
        self.optimizer = optimizer
        # Optimizer's own set-up (step hooks) without re-adding the groups: param_groups, state and defaults
        # are the wrapped optimizer's (properties below), also after its load_state_dict() replaces them
        torch.optim.Optimizer.__setstate__(self, {})
        self.backward_passes_per_step = backward_passes_per_step
        self._sync = SyncState(options, process_group, timeout_s, transport, check_every, compute_threads)
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
        self._by_name = dict(self._params)
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
            if first or (sync.check_every and step % sync.check_every == 0):
                sync.check_params(step, [self._by_name[t.name] for t in sync.plan.tensors])
            sync.runner.begin(step)
        except BaseException as exc:  # the ranks no longer agree on what comes next: unusable
            raise sync.fail(exc)
        self._step = step
        self._background = Background(sync.runner.run, f"casync-step-{step}", lane=sync.runner.lane)

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
        self._remaining[bucket.name] -= 1
        if self._remaining[bucket.name] == 0:
            self._sync.runner.provide(bucket.name, flat)

    # -- synchronization ----------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for this step's synchronized gradients and write them into ``.grad`` (parameters without a
        gradient since the last step count as zeros).  Collective: every rank calls it once per step."""
        with self._lock:
            if self._synchronized:
                return
            sync = self._sync
            try:
                for name, _ in reversed(self._params):
                    if self._passes.get(name, 0) < self.backward_passes_per_step:
                        self._passes[name] = self.backward_passes_per_step
                        self._put(name, self._by_name[name].grad)
                outcome: StepOutcome = self._background.result(2 * sync.timeout_s + 30)
            except NonFiniteGradientError:
                self._reset()
                raise
            except BaseException as exc:
                self._reset()
                raise sync.fail(as_sync_error(exc, f"step {sync.iter}")) from exc
            if not outcome.skipped:
                sync.runner.commit(outcome)
            sync.iter = outcome.step + 1
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
                          "skipped": outcome.skipped, "nonfinite": outcome.nonfinite}
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
        self.synchronize()
        self._synchronized = False
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
        """The wrapped optimizer's state dict plus casync's (plan, steps, every rank's residuals); collective."""
        return {"optimizer": self.optimizer.state_dict(), "casync": self._sync.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (before the first step), checked against these parameters."""
        if not isinstance(state_dict, dict) or "optimizer" not in state_dict or "casync" not in state_dict:
            raise ValueError("expected the output of DistributedOptimizer.state_dict() (keys 'optimizer' and "
                             "'casync')")
        self._sync.load_state_dict(state_dict["casync"])
        if self._sync.plan is None:
            raise ValueError("the casync state has no plan")
        self._sync.check_parameters({n: tuple(p.shape) for n, p in self._params})
        self.optimizer.load_state_dict(state_dict["optimizer"])

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

