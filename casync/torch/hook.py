"""The DDP communication hook: ``ddp.register_comm_hook(state, casync.torch.comm_hook)``.

DDP calls the hook once per gradient bucket, in bucket order, as backward fills the buckets; the hook returns a
``torch.futures.Future`` of the synchronized bucket, and DDP copies its value into the gradients when backward
ends.  With a :class:`~casync.torch.state.CasyncState`:

* **warm-up** — until the plan exists (DDP rebuilds its buckets in its second iteration, its third with
  ``static_graph``, in the order gradients became ready; the hook records that layout and when DDP handed each
  bucket over, and the plan is built with exactly those buckets when that iteration ends: ``"auto"`` plans for
  those hand-over times unless ``ready_times=`` was given) and for the first ``start_iter`` iterations, each bucket
  is all-reduced uncompressed (as float32) on casync's own group.  A state restored from a checkpoint has its
  plan from the first iteration on; one saved before its plan existed warms up again in the new process (its
  compressed iterations then start later than in a run that was not interrupted).
* **compressed** — at an iteration's first bucket this rank opens the plan's step (its receives are posted) and
  a background thread starts running its share of the plan; each bucket's gradient is handed over as DDP
  passes it in, so later buckets' backward overlaps earlier buckets' sync.  When DDP's buckets are the plan's
  (the usual case) DDP's flat buffer is the plan bucket's buffer, without a copy; otherwise (a checkpoint's
  plan on a new layout, or the planner's own buckets) gradients are copied parameter by parameter.  The
  background thread completes every bucket's future once the step's sync is done: with the result written into
  DDP's buffer where the gradients are views into it (``gradient_as_bucket_view``), else with the runner's own
  result buffer, which DDP copies into the gradients anyway (before the next iteration calls the hook).  The
  last bucket's hook waits for that too (DDP waits at the end of backward anyway), so a failure is raised there
  with its :mod:`casync.errors` type (a ``SyncError`` after which DDP, like the state, is unusable).

DGC's keepers (``CasyncState(dgc_clip_norm=, momentum_correction=, momentum_masking=, warmup_steps=)``) change
each bucket's gradients in DDP's buffer before it is synced (:mod:`casync.torch.hook_keepers`), in every
iteration; the sparsity warm-up hands the plan's step its thinned codecs; masking runs once a compressed step's
residuals are committed.

fp16/bf16 buckets (a half-precision model) are synced as float32 on the host and cast back; GPU buckets are
staged through host memory (the codecs run on the CPU; only compressed payloads cross the network).
"""
from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..engines.timeline import op_rows
from ..errors import SyncError
from ..training.dgc import step_codecs
from ..transport.torchdist import as_sync_error
from .hook_keepers import HookKeepers, check_model_optimizers, finite
from .plans import plan_for_buckets
from .runner import Background, StepOutcome
from .state import CasyncState, plan_mismatch


def _host_flat(buffer: torch.Tensor) -> np.ndarray:
    """A bucket buffer as flat float32 host memory: DDP's own buffer when it already is one (no copy)."""
    flat = buffer.detach()
    if flat.device.type != "cpu" or flat.dtype != torch.float32 or not flat.is_contiguous():
        flat = flat.to(device="cpu", dtype=torch.float32).contiguous()
    return flat.reshape(-1).numpy()


def _in_place(like: torch.Tensor) -> bool:
    """Whether a result can be written straight into DDP's bucket buffer (float32 on the host, contiguous)."""
    return like.dtype == torch.float32 and like.device.type == "cpu" and like.is_contiguous()


def _back(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A float32 host result as a tensor of the bucket's dtype and device, never sharing ``array``'s memory
    (the runner reuses it next step): written into DDP's own buffer where that is float32 on the host, as
    PyTorch's allreduce hook does, else cast into a new tensor."""
    if _in_place(like):
        return like.copy_(torch.from_numpy(array).view(like.shape))
    return torch.from_numpy(array).to(device=like.device, dtype=like.dtype, copy=True).view(like.shape)


def _lent(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """The runner's result buffer itself as the bucket's future value (float32 on the host).

    Without ``gradient_as_bucket_view`` DDP copies a hook's result from its buffer into the parameters'
    gradients when backward ends (``finalize_backward``), before the next iteration calls the hook and the
    runner writes this buffer again: lending it saves copying the whole bucket into DDP's buffer first.  (With
    it, the gradients are views into DDP's buffer, and :func:`_back` writing there spares DDP its copy.)"""
    return torch.from_numpy(array).view(like.shape)


@dataclass
class _Entry:
    """One DDP bucket of the step in flight: its future and where its parameters sit in its buffer."""

    future: torch.futures.Future
    like: torch.Tensor  # DDP's buffer (dtype, device, size)
    names: list[str]
    offsets: list[int]  # element offset of each parameter in DDP's buffer
    bucket: str | None = None  # the plan bucket when DDP's buffer is exactly it
    lend: bool = False  # the result may be the runner's buffer itself (:func:`_lent`)
    here: np.ndarray | None = None  # DDP's buffer as the gradient the runner writes the results into


@dataclass
class _Step:
    """A compressed iteration in flight on this rank."""

    step: int
    started: float = 0.0  # time.time() of the iteration's first compressed bucket
    provided: dict[str, float] = field(default_factory=dict)  # plan bucket -> when it was handed to the runner
    entries: list[_Entry] = field(default_factory=list)
    flats: dict[str, np.ndarray] = field(default_factory=dict)  # plan buckets filled parameter by parameter
    remaining: dict[str, int] = field(default_factory=dict)
    background: Background | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    begun: bool = False  # the runner's step is open (its receives posted): buckets go to it at once
    pending: list[tuple[str, np.ndarray, bool]] = field(default_factory=list)  # buckets in before that: (bucket,
    # flat, results_here), handed over by the background thread once it has opened the step


class HookSession:
    """The hook's bookkeeping in this process (names of DDP's parameters, the recorded layout, the step in
    flight); made at the first hook call."""

    def __init__(self, state: CasyncState):
        self.state = state
        self.ddp: Any = None
        self.module: Any = None
        self.seen = 0  # iterations of this DDP module seen by the hook (a resumed state's count starts again)
        self.names: dict[int, str] = {}
        self.layout: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
        self.handed: dict[int, float] = {}  # DDP bucket -> when DDP handed it over in the iteration recorded
        self.current: _Step | None = None
        self.warm: list[torch.futures.Future] = []
        self.where: dict[str, tuple[str, int, int]] = {}  # parameter -> (plan bucket, offset, numel)
        self.exact: dict[tuple[str, ...], str] = {}  # DDP bucket's parameter names -> plan bucket with that layout
        self.stats: dict[str, Any] = {}
        self.last: tuple[_Step, list[tuple]] | None = None  # the last compressed iteration and its op records
        self.unseen: set[str] | None = None  # plan parameters DDP has not passed yet in the first compressed step
        self.keeping: HookKeepers | None = None  # DGC's keepers, set up at the first hook call when asked for
        self.warmup: dict[str, Any] = {}  # the plan's codecs the sparsity warm-up thins out

    # -- naming DDP's parameters -----------------------------------------------------------------------------
    def _discover(self) -> None:
        module = self.state.model
        if module is None:  # the DDP module this state is registered on
            from torch.nn.parallel import DistributedDataParallel

            for obj in gc.get_objects():
                if isinstance(obj, DistributedDataParallel) and any(
                        s is self.state for _, s in getattr(obj, "_comm_hooks", ())):
                    module = obj
                    break
        if module is None:
            raise ValueError("casync.torch.comm_hook cannot find the DistributedDataParallel module it is registered "
                             "on; pass CasyncState(model=ddp_model)")
        self.ddp = module
        self.module = getattr(module, "module", module)
        self.names = {id(p): name for name, p in self.module.named_parameters()}

    def _names(self, params: list[torch.Tensor]) -> list[str]:
        if any(id(p) not in self.names for p in params):
            self._discover()
        unknown = [tuple(p.shape) for p in params if id(p) not in self.names]
        if unknown:
            raise ValueError(f"DDP's bucket holds parameters of shapes {unknown[:4]} that the model given to "
                             "CasyncState(model=...) does not have")
        return [self.names[id(p)] for p in params]

    def synced(self) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """The parameters DDP syncs, name -> shape: those that require a gradient (outside DDP's ignore list),
        and those that do not now but may still be in DDP's buckets (DDP bucketed the parameters that required a
        gradient when it was built: a layer frozen after wrapping, with ``find_unused_parameters=True``, stays)."""
        if self.module is None:
            self._discover()
        ignored = set(getattr(self.module, "_ddp_params_and_buffers_to_ignore", ()) or ())
        named = [(n, p) for n, p in self.module.named_parameters() if n not in ignored]
        return ({n: tuple(p.shape) for n, p in named if p.requires_grad},
                {n: tuple(p.shape) for n, p in named if not p.requires_grad})

    # -- the hook ------------------------------------------------------------------------------------------------
    def __call__(self, bucket: dist.GradBucket) -> torch.futures.Future:
        state = self.state
        state.check_usable()
        try:
            params = list(bucket.parameters())
            names = self._names(params)
            if getattr(self.ddp, "_divide_by_initial_world_size", True) is False:
                raise ValueError("DDP's join(divide_by_initial_world_size=False) is not supported by casync's hook, "
                                 "which averages over every rank (a joined rank gives zeros), as PyTorch's own "
                                 "hooks do: use join() with its default divide_by_initial_world_size=True")
            buffer = bucket.buffer()
            if buffer.layout != torch.strided:
                raise TypeError(f"DDP's bucket of {names[:4]} holds {buffer.layout} gradients; casync syncs dense "
                                "gradients only (e.g. nn.Embedding(sparse=False))")
            offsets = _offsets(bucket, buffer, params)
            if state.keeper_options.dgc_clip_norm is not None or state.keeper_options.momentum_correction is not None:
                if self.keeping is None:
                    self._keep()
                return self.keeping(bucket, buffer, names, offsets, self._dispatch)
            return self._dispatch(bucket, buffer, names, offsets)
        except BaseException as exc:  # DDP's reducer is unusable after an exception in a hook; so is the state
            if self.keeping is not None:
                self.keeping.drop()
            state.fail(exc)
            raise

    def _dispatch(self, bucket: dist.GradBucket, buffer: torch.Tensor, names: list[str], offsets: list[int]
                  ) -> torch.futures.Future:
        if self.state.compressing:
            return self._compressed(bucket, buffer, names, offsets)
        return self._warmup(bucket, buffer, names, offsets)

    def _keep(self) -> None:
        """DGC's keepers for the parameters DDP syncs (momentum buffers from a checkpoint, if any), after checking
        that no optimizer of the model has momentum of its own (momentum correction)."""
        state = self.state
        synced, maybe = self.synced()
        if state.keeper_options.momentum_correction is not None and not state.optimizer_checked:
            check_model_optimizers(self.module)
            state.optimizer_checked = True
        params = dict(self.module.named_parameters())
        shapes = {**maybe, **synced}
        self.keeping = HookKeepers(state.make_keepers({n: params[n] for n in shapes}), shapes)

    def _warmup(self, bucket: dist.GradBucket, buffer: torch.Tensor, names: list[str], offsets: list[int]
                ) -> torch.futures.Future:
        """Uncompressed: an all-reduce of the bucket (as float32) on casync's control group."""
        state = self.state
        group = state.ensure_group()
        if state.plan is None and self._rebuilt():  # DDP's rebuilt buckets: the plan's, in buffer order
            shapes = [tuple(p.shape) for p in bucket.parameters()]
            self.layout[bucket.index()] = [(n, s) for _, n, s in sorted(zip(offsets, names, shapes))]
            self.handed[bucket.index()] = time.perf_counter()
        work = buffer.detach().to(device="cpu", dtype=torch.float32, copy=True)
        divisor = group.world if state.options.op == "mean" else 1

        def back(fut: torch.futures.Future) -> torch.Tensor:
            out = fut.value()[0]
            if divisor != 1:
                out.div_(divisor)
            return out if buffer.dtype == torch.float32 and buffer.device.type == "cpu" else \
                out.to(device=buffer.device, dtype=buffer.dtype)

        future = group.all_reduce_async(work).then(back)
        self.warm.append(future)
        if bucket.is_last():
            warm, self.warm = self.warm, []
            step = state.iter
            for f in warm:  # DDP waits for them right after this; a failure is raised here, typed
                try:
                    f.wait()
                except Exception as exc:
                    raise state.fail(as_sync_error(exc, f"iteration {step}: uncompressed all-reduce")) from exc
            voided = None
            if state.options.nonfinite == "skip":  # the sums are alike on every rank: all void the step, or none
                voided = not all(bool(torch.isfinite(f.value()).all()) for f in warm)
                if voided:
                    for f in warm:  # DDP copies these into the gradients once backward ends
                        f.value().zero_()
                self.stats = {"step": step, "skipped": voided, "warm_up": True}
            if state.keepers is not None and state.keepers.momentum is not None:  # u back if NaN/Inf reached it
                state.keepers.finish(voided if voided is not None else
                                     not all(bool(torch.isfinite(f.value()).all()) for f in warm))
            if state.plan is None and self._rebuilt():
                self._build_plan()
            state.iter += 1
            self.seen += 1
        return future

    def _rebuilt(self) -> bool:
        """Whether DDP's buckets are final in this iteration: DDP rebuilds them once, in the order gradients became
        ready, at the start of its second iteration (its third with ``static_graph``), counted for this module
        and process, whatever iteration a resumed state is at."""
        return self.seen >= (2 if getattr(self.ddp, "static_graph", False) else 1)

    def _build_plan(self) -> None:
        """The plan of the layout DDP used in this iteration (every rank builds it; the planner runs on rank 0)."""
        state, group = self.state, self.state.ensure_group()
        indices = sorted(self.layout)
        if indices != list(range(len(indices))):
            raise SyncError(f"DDP called the hook for buckets {indices} in iteration {state.iter}; expected 0..n-1")
        buckets = [self.layout[i] for i in indices]
        if state.options.planned:
            plan = plan_for_buckets(state.options, buckets, group.world, self._handed_times()) \
                if group.rank == 0 else None
            plan = group.broadcast_object(plan.to_dict() if plan is not None else None, "sharing the planned plan")
            from ..plan.syncplan import SyncPlan

            state.plan = SyncPlan.from_dict(plan, source="rank 0's plan")
        else:
            state.plan = plan_for_buckets(state.options, buckets, group.world)
        self.layout, self.handed = {}, {}

    def _handed_times(self) -> dict[str, float]:
        """When each parameter's gradient was ready in the recorded iteration, as the planner's ``ready_times``:
        its DDP bucket's hand-over, in seconds after the first bucket's (this rank's; rank 0 plans for all)."""
        first = min(self.handed.values())
        return {name: self.handed[i] - first for i, members in self.layout.items() for name, _ in members}

    def _compressed(self, bucket: dist.GradBucket, buffer: torch.Tensor, names: list[str], offsets: list[int]
                    ) -> torch.futures.Future:
        state = self.state
        ctx = self.current
        if ctx is None:
            ctx = self.current = self._open()
        if self.unseen is not None:  # the first compressed step: DDP may hold parameters frozen since (not planned)
            extra = [n for n in names if n not in self.where]
            if extra:
                self.current = None
                raise state.fail(plan_mismatch([f"parameters synced by DDP now but not in the plan: {extra[:5]}"]))
        entry = _Entry(torch.futures.Future(), buffer, names, offsets)
        with ctx.lock:
            ctx.entries.append(entry)
        runner = state.runner
        flat = _host_flat(buffer)
        exact = self.exact.get(tuple(names))
        if exact is not None and offsets == self._member_offsets(exact) and flat.size == state.plan.bucket(exact).numel:
            entry.bucket = exact
            if _in_place(buffer) and exact in runner.overwritable:  # results written into DDP's buffer: no copy
                entry.here = flat
            else:
                entry.lend = _in_place(buffer) and not _all_in(buffer, [p.grad for p in bucket.parameters()])
            self._provide(ctx, exact, flat, entry.here is not None)
        else:
            for name, offset in zip(names, offsets):
                target, start, numel = self.where[name]
                if target not in ctx.flats:
                    ctx.flats[target] = np.empty(state.plan.bucket(target).numel, np.float32)
                    ctx.remaining[target] = len(state.plan.bucket(target).members)
                ctx.flats[target][start:start + numel] = flat[offset:offset + numel]
                ctx.remaining[target] -= 1
                if ctx.remaining[target] == 0:
                    self._provide(ctx, target, ctx.flats[target], False)
        if self.unseen is not None:
            self.unseen.difference_update(names)
        if bucket.is_last():
            self.current = None
            if self.unseen:  # frozen since DDP was built, yet not in DDP's buckets: the plan waits for them
                missing, self.unseen = sorted(self.unseen), None
                raise state.fail(plan_mismatch([f"parameters in the plan but not synced by DDP now: {missing[:5]}"]))
            self.unseen = None
            try:
                ctx.background.result(2 * state.timeout_s + 30)
            except BaseException as exc:
                raise state.fail(as_sync_error(exc, f"step {ctx.step}")) from exc
        return entry.future

    def _provide(self, ctx: _Step, bucket: str, flat: np.ndarray, results_here: bool) -> None:
        """Hand a plan bucket's gradient to the runner, or, before the background thread has opened the step, to
        that thread (it hands it over then)."""
        ctx.provided[bucket] = time.time()
        with ctx.lock:
            if not ctx.begun:
                ctx.pending.append((bucket, flat, results_here))
                return
        self.state.runner.provide(bucket, flat, results_here=results_here)

    def _member_offsets(self, bucket: str) -> list[int]:
        return [m.offset for m in self.state.plan.bucket(bucket).members]

    def _open(self) -> _Step:
        """Start a compressed iteration: runner (first time: shared memory, the plan check), the replica check
        when due, then the step's receives and its background thread."""
        state = self.state
        first = state.runner is None
        if first:
            state.check_parameters(*self.synced())
            self.unseen = {t.name for t in state.plan.tensors}  # checked at this iteration's last bucket
            state.ensure_runner()
            self.where = {}
            for b in state.plan.buckets:
                for m in b.members:
                    self.where[m.spec.name] = (b.name, m.offset, m.spec.numel)
            self.exact = {tuple(m.spec.name for m in b.members): b.name for b in state.plan.buckets}
        state.check_plan_once()
        if first:
            self.warmup = state.keeper_options.warmup_codecs(state.plan)
        step = state.iter
        if first or (state.check_every and step % state.check_every == 0):  # and at this process's first step
            params = dict(self.module.named_parameters())
            state.check_params(step, [params[t.name] for t in state.plan.tensors], took_step=not joined())
        ctx = _Step(step, started=time.time())
        ctx.background = Background(lambda: self._run(ctx), f"casync-step-{step}", lane=state.runner.lane)
        return ctx

    def _codecs(self, step: int) -> dict[str, Any] | None:
        """The step's codecs under DGC's sparsity warm-up (None: the plan's), counted in iterations done."""
        options = self.state.keeper_options
        return step_codecs(step, False, self.state.plan.codecs, self.warmup, options.warmup_start_ratio,
                           options.warmup_steps)[0]

    def _run(self, ctx: _Step) -> StepOutcome:
        """Background thread: open the step (post its receives: off backward's thread, whose every call that lets
        the GIL go can wait for this rank's other threads), hand over the buckets that came in meanwhile, run the
        step's ops to the end, then complete every DDP bucket's future."""
        state = self.state
        try:
            codecs = self._codecs(ctx.step)
            state.runner.begin(ctx.step, **({"codecs": codecs} if codecs is not None else {}))
            if state.error is not None:  # the hook failed on backward's thread before the step was open
                state.runner.abort(state.error)
            with ctx.lock:
                ctx.begun = True
                pending, ctx.pending = ctx.pending, []
            for bucket, flat, results_here in pending:
                state.runner.provide(bucket, flat, results_here=results_here)
            outcome = state.runner.run()
        except BaseException as exc:
            with ctx.lock:
                for entry in ctx.entries:
                    entry.future.set_exception(exc)
            raise
        if not outcome.skipped:
            state.runner.commit(outcome)
        if state.keepers is not None and state.keepers.momentum is not None:
            state.keepers.finish(outcome.skipped or not finite(outcome.results.values()), state.runner.residuals,
                                 state.runner.actor, state.plan)
        state.iter = ctx.step + 1
        self.last = (ctx, outcome.records)  # made into rows only when asked for (CasyncState.timeline)
        self.stats = {"step": ctx.step, "sent_bytes": outcome.sent_bytes, "raw_bytes": outcome.raw_bytes,
                      "in_place": sum(1 for e in ctx.entries if e.here is not None),
                      "as_planned": sum(1 for e in ctx.entries if e.bucket is not None),  # DDP buckets = plan's
                      "lent": sum(1 for e in ctx.entries if e.lend),
                      "skipped": outcome.skipped, "nonfinite": outcome.nonfinite}
        with ctx.lock:
            for entry in ctx.entries:
                entry.future.set_result(self._result(entry, outcome))
        return outcome

    def rows(self) -> list[dict[str, Any]]:
        """This rank's ops of the last compressed iteration as timeline rows, and a ``backward`` row from its
        first compressed bucket to the last bucket DDP handed over: the part of backward the sync ran beside."""
        if self.last is None:
            return []
        ctx, records = self.last
        actor = self.state.runner.actor
        rows = op_rows(ctx.step, {actor: records})
        if ctx.provided:
            rows.append(dict(op="backward", actor=actor, bucket="", part=-1, start=ctx.started,
                             end=max(ctx.provided.values()), nbytes=0, node="", step=ctx.step, cpu=None, queued=None))
        return rows

    def _result(self, entry: _Entry, outcome: StepOutcome) -> torch.Tensor:
        if entry.bucket is not None:
            result = outcome.results[entry.bucket]
            if result is entry.here:  # (a skipped step's zeros are arrays of their own)
                return entry.like
            return (_lent if entry.lend else _back)(result, entry.like)
        like = entry.like
        out = like.detach().view(-1).numpy() if _in_place(like) else np.empty(like.numel(), np.float32)
        out.fill(0.0)  # what lies between DDP's gradient views
        for name, offset in zip(entry.names, entry.offsets):
            source, start, numel = self.where[name]
            out[offset:offset + numel] = outcome.results[source][start:start + numel]
        return like if _in_place(like) else _back(out, like)


def joined() -> bool:
    """Whether DDP calls the hook for a rank that has joined (``ddp.join()`` with uneven inputs: out of data, it
    shadows the others' backward with zero gradients, from its join hook, outside any backward pass)."""
    return torch._C._current_graph_task_id() == -1


def _all_in(buffer: torch.Tensor, tensors: list[torch.Tensor | None]) -> bool:
    """Whether every tensor is a view into ``buffer``'s memory.  For the parameters' ``.grad``: DDP's
    ``gradient_as_bucket_view`` (without it DDP copies the hook's result into separate gradients when backward
    ends); for ``bucket.gradients()``: DDP's views of this iteration's gradients in the buffer."""
    storage = buffer.untyped_storage().data_ptr()
    return all(t is not None and t.untyped_storage().data_ptr() == storage for t in tensors)


def _offsets(bucket: dist.GradBucket, buffer: torch.Tensor, params: list[torch.Tensor]) -> list[int]:
    """Where each parameter's gradient starts in the bucket's flat buffer (from DDP's views into it)."""
    grads = bucket.gradients()
    if len(grads) == len(params) and _all_in(buffer, grads):
        return [g.storage_offset() - buffer.storage_offset() for g in grads]
    offsets, at = [], 0
    for p in params:
        offsets.append(at)
        at += p.numel()
    return offsets


def comm_hook(state: CasyncState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook running casync's plan: ``ddp.register_comm_hook(CasyncState(...), comm_hook)``.

    Returns a future of the bucket's synchronized gradient (mean over ranks, or sum with ``op="sum"``), bit for
    bit what :class:`casync.LocalEngine` computes for the same plan, gradients and step."""
    if not isinstance(state, CasyncState):
        raise TypeError(f"casync.torch.comm_hook needs a casync.torch.CasyncState as its state, got "
                        f"{type(state).__name__}")
    if state.session is None:
        state.session = HookSession(state)
    return state.session(bucket)


# DDP checks the hook's annotations against these exact objects (this module's are strings)
comm_hook.__annotations__ = {"state": CasyncState, "bucket": dist.GradBucket,
                             "return": torch.futures.Future[torch.Tensor]}
