"""The Ray actors of a Trainer.

A :class:`TrainWorker` holds a model replica, its optimizer and its data shard, and runs its share of the
sync plan itself (``casync.training.step_sync``): autograd hooks copy each parameter's gradient into its
bucket as back-propagation produces it, and a full bucket goes to the actor's per-rank executor at once, so
its sync runs on the sync thread while backward continues on earlier layers.  Training calls
(``train_step``, ``apply``, state) run one at a time in Ray's default group.
"""
from __future__ import annotations

import copy
import functools
import time
import zlib
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch

from casync.primitives.codecs import Codec

from ..engines.nonfinite import BucketLayout, NonFiniteReport, voids_step
from ..errors import SyncError
from ..schedule import ActorShare
from .dgc import MomentumCorrection, step_codecs
from .options import TrainOptions
from .plain import batch_size, rng_state, seed_everything, set_rng_state, to_numpy_tree, to_torch_tree, worker_seed
from .step_sync import StepState, StepSyncActor

#: Where one trained parameter lives: (name, shape, bucket, offset) in backward order.
Layout = list[tuple[str, tuple[int, ...], str, int]]


class TrainWorker(StepSyncActor):
    """One data-parallel worker: model replica, optimizer, data shard, and its share of every sync."""

    def __init__(self, name: str, rank: int, world_size: int, shares: dict[bool, ActorShare], codecs: dict[str, Codec],
                 plan_seed: int, partitions: dict[str, list[tuple[int, int]]], layout: Layout,
                 fns: tuple[Callable, Callable, Callable, Callable], options: TrainOptions,
                 warmup: dict[str, Codec], layouts: list[BucketLayout] = (), nonfinite: str = "raise"):
        super().__init__(name, shares, codecs, plan_seed, partitions, options.timeout_s, options.compute_threads)
        self.rank, self.world_size, self.options = rank, world_size, options
        self._rank, self._layouts, self.nonfinite = rank, {lay.name: lay for lay in layouts}, nonfinite
        self._warmup = warmup
        self._init_error: BaseException | None = None
        try:
            self._setup(layout, fns)
        except Exception as exc:  # reported by ready(): a failed constructor would only say "actor died"
            self._init_error = exc

    def _setup(self, layout: Layout, fns: tuple[Callable, Callable, Callable, Callable]) -> None:
        model_fn, optimizer_fn, loss_fn, data_fn = fns
        torch.set_num_threads(self.options.torch_threads)
        torch.use_deterministic_algorithms(self.options.deterministic)
        seed_everything(self.options.seed)  # the same initial model on every worker
        self.model = model_fn()
        self._model_fn, self._optimizer_fn, self.loss_fn = model_fn, optimizer_fn, loss_fn
        params = dict(self.model.named_parameters())
        built = {n: tuple(p.shape) for n, p in params.items() if p.requires_grad}
        expected = {name: shape for name, shape, _, _ in layout}
        if built != expected:
            diff = sorted(set(built.items()) ^ set(expected.items()))[:4]
            raise ValueError(f"worker {self.rank}: model_fn built trainable parameters that differ from the "
                             f"driver's model (name, shape) in {diff}; model_fn must build the same model every call")
        seed_everything(worker_seed(self.options.seed, self.rank))
        self.optimizer = optimizer_fn(self.model.parameters())
        self.data = data_fn(self.rank, self.world_size)
        if self.data_length() == 0:
            raise ValueError(f"worker {self.rank}: data_fn({self.rank}, {self.world_size}) returned an empty shard")
        self._iter: Any = None
        self.epoch, self.index = 0, 0
        self._epoch_rng: dict[str, Any] | None = None
        self._slots = {name: (bucket, offset, offset + int(np.prod(shape, dtype=np.int64)))
                       for name, shape, bucket, offset in layout}
        self._trained = [(name, params[name]) for name, _, _, _ in layout]
        self._bucket_numel = {b: parts[-1][1] for b, parts in self._partitions.items()}
        self._bucket_members: dict[str, list[str]] = {}
        for name, _, bucket, _ in layout:
            self._bucket_members.setdefault(bucket, []).append(name)
        self._momentum = (MomentumCorrection(self.options.momentum_correction, dict(self._trained))
                          if self.options.momentum_correction is not None else None)
        self._current: StepState | None = None
        for name, p in self._trained:
            p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, name))

    def ready(self) -> str:
        if self._init_error is not None:
            raise self._init_error
        return self.name

    def data_length(self) -> int | None:
        try:
            return len(self.data)
        except TypeError:
            return None

    # -- one training step ------------------------------------------------------------------
    def train_step(self, step: int, full: bool, *after: Any) -> dict[str, Any]:
        """Forward and backward on the next batch; gradients flow into the buckets (and their syncs) as
        autograd produces them."""
        codecs, density = step_codecs(step, full, self._codecs, self._warmup, self.options.warmup_start_ratio,
                                      self.options.warmup_steps)
        grads = {b: np.empty(n, np.float32) for b, n in self._bucket_numel.items()}
        st = self._open(step, full, grads, {b: len(m) for b, m in self._bucket_members.items()}, codecs)
        if self._momentum is not None and (self.nonfinite == "skip" or (self.nonfinite == "raise"
                                                                        and not self.options.delayed_update)):
            st.momentum = self._momentum.state_dict()  # restored if the step is voided for NaN/Inf
        self._current = st
        try:
            batch = self._next_batch()
            self.optimizer.zero_grad(set_to_none=True)
            f0 = time.time()
            loss = self.loss_fn(self.model, batch)
            if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point()):
                got = f"{type(loss).__name__} {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else repr(loss)
                raise TypeError(f"worker {self.rank}, step {step}: loss_fn must return a scalar floating-point "
                                f"tensor, got {got[:80]}")
            if not loss.requires_grad:
                raise ValueError(f"worker {self.rank}, step {step}: the loss does not depend on any trainable "
                                 "parameter (loss.requires_grad is False)")
            f1 = time.time()
            loss.backward()
            b1 = time.time()
            for name, _ in self._trained:  # parameters that got no gradient this step contribute zeros
                if name not in st.filled:
                    self._deliver(st, name, None)
        except BaseException as exc:
            exc.add_note(f"(casync.Trainer worker {self.rank}, step {step}: data_fn's batch, loss_fn or backward)")
            with self._cond:
                st.failed = f"worker {self.rank} failed computing step {step}: {type(exc).__name__}: {exc}"
                self._cond.notify_all()
            raise
        finally:
            self._current = None
        st.compute = [("forward", "", -1, f0, f1, 0, ""), ("backward", "", -1, f1, b1, 0, "")]
        return {"loss": float(loss.detach()), "samples": batch_size(batch), "compute": st.compute,
                "density": density}

    def _next_batch(self) -> Any:
        if self._iter is None:
            self._start_epoch()
        try:
            batch = next(self._iter)
        except StopIteration:
            if self.index == 0:
                raise ValueError(f"worker {self.rank}: data_fn({self.rank}, {self.world_size}) yielded no "
                                 "batches") from None
            self.epoch += 1
            self._start_epoch()
            try:
                batch = next(self._iter)
            except StopIteration:
                raise ValueError(f"worker {self.rank}: data_fn's iterable is exhausted after one epoch; return a "
                                 "re-iterable (a list, a DataLoader), not an iterator or generator") from None
        self.index += 1
        return batch

    def _start_epoch(self) -> None:
        """A new pass over the shard; the RNG state at this moment fixes its batch order (shuffling)."""
        self._epoch_rng = rng_state()
        self._iter = iter(self.data)
        self.index = 0

    def _on_grad(self, name: str, param: torch.Tensor) -> None:
        st = self._current
        if st is not None:  # a backward pass outside train_step has nothing to sync
            self._deliver(st, name, param.grad)

    def _deliver(self, st: StepState, name: str, grad: torch.Tensor | None) -> None:
        """Put one parameter's gradient (momentum-corrected if asked) into its bucket; a full bucket goes to
        the sync."""
        if name in st.filled:
            raise RuntimeError(f"worker {self.rank}, step {st.step}: parameter {name!r} received a second "
                               "gradient in one step; loss_fn must not call backward itself")
        bucket, start, stop = self._slots[name]
        value = self._momentum.correct(name, grad) if self._momentum is not None else grad
        target = torch.from_numpy(st.grads[bucket][start:stop])
        if value is None:
            target.zero_()
        else:
            target.copy_(value.detach().reshape(-1))
        st.filled.add(name)
        with self._cond:
            st.remaining[bucket] -= 1
            if st.remaining[bucket] == 0:
                self._bucket_in(st, bucket)

    def _finished(self, st: StepState) -> None:
        pass  # a worker keeps the finished step until apply() uses its results

    def apply(self, step: int, check: bool, n_reports: int, *args: Any) -> dict[str, Any]:
        """Apply step ``step``'s synchronized gradients with the optimizer; optionally hash the parameters.

        ``args[:n_reports]``: every worker's NaN/Inf reports of the step (the rest only orders this call).
        Under ``nonfinite="raise"`` or ``"skip"`` any report voids the step on this worker, as on every other
        (they all see the same reports): no optimizer step, and without ``delayed_update`` the error-feedback
        residuals and momentum-correction buffers go back to before the step."""
        reports = [r for worker_reports in args[:n_reports] for r in worker_reports]
        with self._cond:
            st = self._steps.get(step)
            if st is None or not st.finished:
                raise SyncError(f"{self.name}: apply of step {step}, whose sync has not finished")
            del self._steps[step]
        u0 = time.time()
        if voids_step(self.nonfinite, reports):
            if not self.options.delayed_update:  # with it, step t+1's sync has already read these residuals
                self.rollback(step, rerun=self.nonfinite == "raise")
                if st.momentum is not None:
                    self._momentum.load_state_dict(st.momentum)
            elif st.momentum is not None:
                # step t+1 has already folded its gradient into momentum made non-finite by step t's: back to
                # before step t, which also drops step t+1's gradient (t+1 is voided too: its momentum held
                # NaN/Inf), so voiding t+1 must not restore the poisoned momentum it started from
                self._momentum.load_state_dict(st.momentum)
                with self._cond:
                    following = self._steps.get(step + 1)
                    if following is not None:
                        following.momentum = None
            self.optimizer.zero_grad(set_to_none=True)
            return {"update": ("update", "", -1, u0, time.time(), 0, ""), "voided": reports,
                    "hash": self.param_hash() if check else None}
        self._set_grads(self._trained, st.results)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.options.momentum_masking:
            self._mask_momentum()
        u1 = time.time()
        return {"update": ("update", "", -1, u0, u1, 0, ""), "voided": [],
                "hash": self.param_hash() if check else None}

    def _set_grads(self, params: list[tuple[str, torch.Tensor]], results: dict[str, np.ndarray]) -> None:
        for name, p in params:
            bucket, start, stop = self._slots[name]
            g = torch.from_numpy(results[bucket][start:stop]).view(p.shape)
            p.grad = g.to(device=p.device, dtype=p.dtype)

    def _mask_momentum(self) -> None:
        """Zero the corrected momentum where this worker's residual is zero: what it accumulated was sent."""
        self._momentum.mask_sent(self.residuals, self.name, {
            bucket: (parts, self._bucket_numel[bucket], [(n, *self._slots[n][1:]) for n in self._bucket_members[bucket]])
            for bucket, parts in self._partitions.items()})

    # -- inspection and state ------------------------------------------------------------------
    def param_hash(self) -> int:
        """CRC-32 over every parameter's bytes (trainable or not), in registration order."""
        crc = 0
        for p in self.model.parameters():
            crc = zlib.crc32(np.ascontiguousarray(p.detach().cpu().numpy()), crc)
        return crc

    def _pending(self) -> StepState | None:
        with self._cond:
            done = [st for st in self._steps.values() if st.finished]
        return done[0] if done else None

    def model_state(self, *reports: list[NonFiniteReport]) -> dict[str, np.ndarray]:
        """The model's state dict as NumPy arrays; with a delayed update still pending, as it will be once
        applied (computed on a copy, so training continues exactly as it would have).  ``reports``: every
        worker's NaN/Inf reports of the pending step (a step they void is not applied)."""
        model = self.model
        pending = self._pending()
        if pending is not None and voids_step(self.nonfinite, [r for rs in reports for r in rs]):
            pending = None
        if pending is not None:
            saved = rng_state()
            model = self._model_fn()
            set_rng_state(saved)
            model.load_state_dict(self.model.state_dict())
            optimizer = self._optimizer_fn(model.parameters())
            optimizer.load_state_dict(copy.deepcopy(self.optimizer.state_dict()))
            params = dict(model.named_parameters())
            self._set_grads([(name, params[name]) for name, _ in self._trained], pending.results)
            optimizer.step()
        return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}

    def momentum_buffers(self) -> dict[str, np.ndarray]:
        return self._momentum.state_dict() if self._momentum is not None else {}

    def export_state(self, include_model: bool) -> dict[str, Any]:
        """Everything a checkpoint needs from this worker (model and optimizer only when asked: they are the
        same on every worker)."""
        pending = self._pending()
        state: dict[str, Any] = {
            "rank": self.rank, "hash": self.param_hash(), "residuals": dict(self.residuals),
            "momentum": self.momentum_buffers(), "rng": rng_state(),
            "data": {"epoch": self.epoch, "index": self.index, "epoch_rng": self._epoch_rng},
            "pending_step": pending.step if pending is not None else None,
            # what apply() of the pending step needs besides its results: this worker's NaN/Inf reports and
            # the momentum-correction buffers from before the step (to void it)
            "pending_nonfinite": [asdict(r) for r in pending.nonfinite] if pending is not None else [],
            "pending_momentum": pending.momentum if pending is not None else None,
        }
        if include_model:
            state["model"] = {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}
            state["optimizer"] = to_numpy_tree(self.optimizer.state_dict())
            state["pending_results"] = pending.results if pending is not None else None
        return state

    def import_state(self, common: dict[str, Any], own: dict[str, Any]) -> int:
        """Restore a checkpoint: ``common`` (model, optimizer, a pending update: the same for every worker)
        and ``own`` (this worker's residuals, momentum, RNG and data position).  Returns the parameter hash."""
        state = dict(common, **own)
        self.model.load_state_dict({k: torch.from_numpy(np.array(v, copy=True)) for k, v in state["model"].items()})
        self.optimizer.load_state_dict(to_torch_tree(state["optimizer"]))
        self.set_residuals(state["residuals"])
        if self._momentum is not None:
            self._momentum.load_state_dict(state["momentum"])
        elif state["momentum"]:
            raise ValueError("the checkpoint has momentum-correction buffers but momentum_correction is off")
        data = state["data"]
        self.epoch, self._epoch_rng = int(data["epoch"]), data["epoch_rng"]
        self._iter, self.index = None, 0
        if self._epoch_rng is not None:  # replay the current epoch's batch order up to the saved position
            set_rng_state(self._epoch_rng)
            self._iter = iter(self.data)
            for i in range(int(data["index"])):
                try:
                    next(self._iter)
                except StopIteration:
                    raise ValueError(f"worker {self.rank}: data_fn yields {i} batches in epoch {self.epoch}, "
                                     f"fewer than the checkpoint's position {data['index']}") from None
            self.index = int(data["index"])
        set_rng_state(state["rng"])
        with self._cond:
            self._steps.clear()
            if state.get("pending_results") is not None:
                results = {b: np.array(v, dtype=np.float32, copy=True) for b, v in state["pending_results"].items()}
                momentum = state.get("pending_momentum")
                self._steps[state["pending_step"]] = StepState(
                    state["pending_step"], False, {}, {}, finished=True, results=results,
                    nonfinite=[NonFiniteReport(**r) for r in state.get("pending_nonfinite", [])],
                    momentum=None if momentum is None else {k: np.array(v, np.float32) for k, v in momentum.items()})
        return self.param_hash()
