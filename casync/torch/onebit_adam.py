"""``OneBitAdam``: Adam with its momentum synchronized 1-bit compressed after a full-precision warm-up, on casync.

    opt = casync.torch.OneBitAdam(model.named_parameters(), lr=1e-3, warmup_steps=1000)   # strategy="ps", onebit
    loss.backward()
    opt.step()

Error feedback on the gradients under plain Adam fails (Adam's variance is not linear in the gradient, so the
compression error does not cancel out); 1-bit Adam (Tang et al. 2021, DeepSpeed's ``OnebitAdam``) compresses
the momentum instead, with the variance frozen.  With ``t`` the step (1, 2, ...), ``K = warmup_steps``, ``g_i``
rank ``i``'s local gradient and ``g`` the mean of the ``g_i``:

* warm-up, ``t <= K`` (``g`` all-reduced uncompressed on casync's own group): exactly ``torch.optim.Adam`` (``AdamW``
  with ``weight_decay``) on ``g``: ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g*g``, ``x = x*(1 - lr*wd)``,
  ``x -= lr/(1-b1**t) * m / (sqrt(v)/sqrt(1-b2**t) + eps)``;
* compression, ``t > K``: ``v`` stays frozen at ``v_K``; each rank computes ``m_i = b1*m + (1-b1)*g_i`` and the
  casync plan syncs the ``m_i``, compressed with error feedback at the worker's encode and at the server's (or
  ring hop's) re-encode; ``m`` = the synchronized mean (alike on every rank), ``x = x*(1 - lr*wd)``,
  ``x -= lr/(1-b1**t) * m / (sqrt(v_K)/sqrt(1-b2**K) + eps)``.

Bias correction: ``bias_correction=True`` (default) corrects as ``torch.optim.Adam`` does, so the warm-up is
PyTorch's Adam, and the frozen variance is the corrected estimate ``v_K/(1-b2**K)``: uncorrected (DeepSpeed's
choice, ``bias_correction=False``: both corrections 1) it is too small by ``1-b2**K`` for the rest of training,
every step then ``1/sqrt(1-b2**K)`` times too large (3.2x for ``b2=0.999`` and ``K=100``), and the first warm-up
steps are up to ``(1-b1)/sqrt(1-b2)`` (3.2x) too large.  The momentum's correction ``1-b1**t`` goes on past the
warm-up (it tends to 1; the synced momentum is still an average started at zero).

Where the variance froze at exactly zero (no gradient in the whole warm-up: a dead unit, an unused embedding row)
the update ``m/eps`` would be huge, and 1 bit cannot send the zero momentum such an element has: its synced
momentum is set to zero and it is not updated (DeepSpeed's ``momentum_masks``, here derived from ``v_K``).

Exact buckets (``exact_variance=True``): 1-bit Adam freezes the variance because a compressed sync gives no
gradient to update it with.  A bucket the plan syncs losslessly (codec ``none``, e.g. below ``min_compress_bytes``)
does give one: its synced momentum is the exact mean ``m_t = b1*m + (1-b1)*g``, so ``g = (m_t - b1*m)/(1-b1)``
(up to float rounding), and its parameters go on with Adam's own variance, ``v = b2*v + (1-b2)*g*g`` and its
correction ``1-b2**t``, and no ``v = 0`` mask: Adam itself, while the lossy buckets follow the frozen rule.  Why:
on the word-level LM (benchmarks/results/time_to_accuracy/lm_compressed_adam/), freezing every tensor's variance
diverges even with exact gradients, while freezing only the input embedding's stays within 0.5 % of Adam.  The
likely cause: a decoder row of a rare word sees only the small gradient ``p*h`` (``p`` its tiny probability) in
the warm-up, so its frozen variance is tiny, and the step where the word is the target brings ``(p-1)*h``, far
larger.  Syncing such tensors exactly and compressing the large input embedding keeps most of the saving.  Off by
default (DeepSpeed's rule: every bucket frozen).

The sync runs in :meth:`OneBitAdam.step` (no overlap with backward); a parameter without a gradient counts as a
zero gradient (every rank syncs every parameter every step).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import torch

from ..plan.assemble import make_buckets
from ..plan.specs import TensorSpec
from ..transport.torchdist import as_sync_error
from .adam_rule import apply_update_, check_hyperparameters, corrections, local_momentum, update_moments_
from .plans import SyncOptions, plan_for_buckets
from .runner import Background, check_same_settings
from .onebit_checks import check_compressible, check_plan_feedback, check_warmup_steps, named_groups
from .state import SyncState

STATE_KEY = "onebit_adam"


class OneBitAdam(torch.optim.Optimizer):
    """Adam for data-parallel training whose momentum is synced compressed after ``warmup_steps`` full-precision
    steps (see the module docstring for the exact rule).

    ``params``: ``model.named_parameters()`` or parameter groups of named parameters (the names key the plan and
    the checkpointed residuals); ``lr``, ``betas``, ``eps``, ``weight_decay`` (decoupled, AdamW's) per group.
    ``warmup_steps``: K >= 1 full-precision steps, then the variance is frozen.  ``bias_correction``: Adam's
    (default) or none (DeepSpeed's).  ``exact_variance``: parameters in buckets the plan syncs losslessly keep
    Adam's variance after the warm-up (see the module docstring; default False: all frozen).  ``strategy``
    (default ``"ps"``, with ``two_way=True``: error feedback at the worker and at the server), ``codec`` (default
    ``"onebit"``), ``error_feedback`` and ``**plan_options`` are :func:`casync.build_plan`'s; a lossy codec must
    run with error feedback, and ``op`` must be ``"mean"``.  ``process_group``, ``timeout_s``, ``check_every``, ``transport``, ``compute_threads``: as for
    :class:`~casync.torch.DistributedOptimizer`.  Parameters are broadcast from rank 0 when it is made; construct
    it at the same point on every rank (it creates casync's process groups).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, warmup_steps: int, bias_correction: bool = True,
                 exact_variance: bool = False,
                 strategy: Any = "ps", codec: Any = "onebit", error_feedback: bool | str = "auto",
                 min_compress_bytes: int = 0, nonfinite: str = "propagate", process_group: Any = None,
                 timeout_s: float = 60.0, check_every: int = 10, transport: str = "direct", compute_threads: int = 1,
                 **plan_options: Any):
        check_hyperparameters(lr, betas, eps, weight_decay)
        self.warmup_steps = check_warmup_steps(warmup_steps)
        if not isinstance(bias_correction, bool):
            raise TypeError(f"bias_correction must be True or False, got {bias_correction!r}")
        self.bias_correction = bias_correction
        if not isinstance(exact_variance, bool):
            raise TypeError(f"exact_variance must be True or False, got {exact_variance!r}")
        self.exact_variance = exact_variance
        if nonfinite != "propagate":
            raise ValueError(f"OneBitAdam takes nonfinite='propagate' only (got {nonfinite!r}): a voided step would "
                             "have to roll back the local momentum on every rank; check the loss before step()")
        if plan_options.get("op", "mean") != "mean":
            raise ValueError(f"OneBitAdam syncs the mean of the ranks' momenta: op must be 'mean', got "
                             f"{plan_options['op']!r}")
        options = SyncOptions.make(strategy, codec, error_feedback, min_compress_bytes, nonfinite, plan_options,
                                   fixed_buckets=False)
        check_compressible(options)
        self._built = False
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        named = named_groups(self.param_groups)
        self._sync = SyncState(options, process_group, timeout_s, transport, check_every, compute_threads)
        group = self._sync.ensure_group()
        with torch.no_grad():
            for _, p in named:  # every replica starts from rank 0's parameters
                host = p.detach().cpu().contiguous() if p.device.type != "cpu" or not p.is_contiguous() else p.data
                group.broadcast_(host, "broadcasting parameters from rank 0")
                if host is not p.data:
                    p.data.copy_(host)
        self._params = [(n, p) for n, p in named if p.requires_grad]
        if not self._params:
            raise ValueError("OneBitAdam has no parameter that requires a gradient")
        specs = [TensorSpec(n, tuple(p.shape)) for n, p in reversed(self._params)]
        bucket_bytes = options.bucket_bytes if options.bucket_bytes is not None else 25 << 20
        buckets = [[(s.name, s.shape) for s in g] for g in make_buckets(specs, bucket_bytes)]
        self._sync.plan = plan_for_buckets(options, buckets, group.world)
        check_plan_feedback(self._sync.plan)
        self._by_name = dict(self._params)
        self._step = 0  # Adam steps done (the warm-up position)
        self._checked = False
        self._flats: dict[str, np.ndarray] = {}
        self._group_of: dict[int, dict[str, Any]] = {}
        #: the last step, as the DDP hook's and DistributedOptimizer's: ``{"step", "warm_up": True}`` after a warm-up
        #: step, ``{"step", "sent_bytes", "raw_bytes", "warm_up": False}`` (this rank's sends) after a compressed one
        self.stats: dict[str, Any] = {}
        self._built = True

    # -- a step --------------------------------------------------------------------------------------------------
    @property
    def compressing(self) -> bool:
        """Whether the next step syncs the momentum compressed (the warm-up is over)."""
        return self._step >= self.warmup_steps

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """One Adam step: sync (the gradient in warm-up, the momentum after it) and update every parameter.
        Collective: every rank calls it once per step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        sync = self._sync
        sync.check_usable()
        for name, p in self._params:  # a user's error, before anything is synced: the state stays usable
            self._grad(name, p)
        t = self._step + 1
        # the groups as they are now (LR schedulers change them; load_state_dict replaces them)
        self._group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        try:
            self._check_ranks()
            if self.compressing:
                self._compressed_step(t)
            else:
                self._warmup_step(t)
        except BaseException as exc:
            raise sync.fail(as_sync_error(exc, f"OneBitAdam step {t}")) from exc
        self._step = t
        sync.iter += 1
        return loss

    def _check_ranks(self) -> None:
        """At this process's first step, the ranks' settings, plans and steps; then the replicas when due."""
        sync = self._sync
        group = sync.ensure_group()
        if not self._checked:
            check_same_settings(group, {"warmup_steps": self.warmup_steps, "bias_correction": self.bias_correction,
                                        "exact_variance": self.exact_variance,
                                        "OneBitAdam steps done (load_state_dict)": self._step})
            sync.check_plan_once()
        if not self._checked or (sync.check_every and sync.iter % sync.check_every == 0):
            sync.check_params(sync.iter, [self._by_name[t.name] for t in sync.plan.tensors])
        self._checked = True

    def _fill(self, values: Callable[[str, torch.Tensor], torch.Tensor | None]) -> dict[str, np.ndarray]:
        """Every plan bucket's flat float32 buffer holding ``values(name, param)`` (None: zeros) of its members."""
        plan = self._sync.plan
        for bucket in plan.buckets:
            flat = self._flats.get(bucket.name)
            if flat is None:
                flat = self._flats[bucket.name] = np.empty(bucket.numel, np.float32)
            for member in bucket.members:
                name = member.spec.name
                target = flat[member.offset:member.stop]
                value = values(name, self._by_name[name])
                if value is None:
                    target[...] = 0
                else:
                    torch.from_numpy(target).copy_(value.detach().reshape(-1))
        return self._flats

    def _grad(self, name: str, p: torch.Tensor) -> torch.Tensor | None:
        grad = p.grad
        if grad is not None and grad.layout != torch.strided:
            raise TypeError(f"parameter {name!r} has a {grad.layout} gradient; OneBitAdam syncs dense gradients only")
        return grad

    def _results(self, flats: dict[str, np.ndarray]) -> Iterable[tuple[str, torch.Tensor, torch.Tensor]]:
        """(name, parameter, its slice of the synced values, shaped and on its device)."""
        plan = self._sync.plan
        for name, p in self._params:
            bucket, member = plan.locate(name)
            value = torch.from_numpy(flats[bucket.name][member.offset:member.stop]).view(p.shape)
            yield name, p, value.to(p.device)

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def _warmup_step(self, t: int) -> None:
        """Full precision: all-reduce the gradients (mean) on casync's control group, then Adam."""
        group = self._sync.ensure_group()
        flats = self._fill(self._grad)
        futures = [group.all_reduce_async(torch.from_numpy(flat)) for flat in flats.values()]
        for future in futures:
            future.wait()
        for flat in flats.values():
            flat /= np.float32(group.world)
        self.stats = {"step": self._sync.iter, "warm_up": True}
        for _, p, grad in self._results(flats):
            options, state = self._group_of[id(p)], self._state(p)
            beta1, beta2 = options["betas"]
            update_moments_(state["exp_avg"], state["exp_avg_sq"], grad, beta1, beta2)
            c1, c2 = corrections(beta1, beta2, t, t, self.bias_correction)
            apply_update_(p, state["exp_avg"], state["exp_avg_sq"], float(options["lr"]), options["eps"],
                          options["weight_decay"], c1, c2)

    def _compressed_step(self, t: int) -> None:
        """The local momenta through the casync plan (compressed, error feedback at both ends), then the update
        with the frozen variance."""
        sync = self._sync

        def momentum(name: str, p: torch.Tensor) -> torch.Tensor:
            grad = self._grad(name, p)
            exp_avg = self._state(p)["exp_avg"]
            beta1 = self._group_of[id(p)]["betas"][0]
            return local_momentum(exp_avg, torch.zeros_like(p) if grad is None else grad, beta1)

        runner = sync.ensure_runner()
        flats = self._fill(momentum)
        runner.begin(sync.iter)
        for bucket, flat in flats.items():
            runner.provide(bucket, flat)
        outcome = Background(runner.run, f"casync-onebit-adam-{sync.iter}", lane=runner.lane).result(
            2 * sync.timeout_s + 30)
        runner.commit(outcome)
        self.stats = {"step": outcome.step, "sent_bytes": outcome.sent_bytes, "raw_bytes": outcome.raw_bytes,
                      "warm_up": False}
        exact = self._exact_names()
        for name, p, synced in self._results(outcome.results):
            options, state = self._group_of[id(p)], self._state(p)
            beta1, beta2 = options["betas"]
            if name in exact:  # the mean gradient, recovered from the exact mean momentum: Adam goes on
                grad = (synced - beta1 * state["exp_avg"]) / (1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["exp_avg"].copy_(synced)
                c1, c2 = corrections(beta1, beta2, t, t, self.bias_correction)
            else:
                state["exp_avg"].copy_(synced).masked_fill_(state["exp_avg_sq"] == 0, 0)  # see the module docstring
                c1, c2 = corrections(beta1, beta2, t, self.warmup_steps, self.bias_correction)
            apply_update_(p, state["exp_avg"], state["exp_avg_sq"], float(options["lr"]), options["eps"],
                          options["weight_decay"], c1, c2)

    def _exact_names(self) -> frozenset[str]:
        """The parameters that keep Adam's variance after the warm-up: those in buckets the plan syncs losslessly,
        with ``exact_variance`` (none without it)."""
        if not self.exact_variance:
            return frozenset()
        return frozenset(member.spec.name for bucket in self._sync.plan.buckets if bucket.codec.lossless
                         for member in bucket.members)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_built", False):
            raise ValueError("casync's plan is built when OneBitAdam is made: pass every parameter group to it then")
        options = {**self.defaults, **param_group}
        check_hyperparameters(options["lr"], options["betas"], options["eps"], options["weight_decay"],
                              f" (parameter group {len(self.param_groups)})")
        super().add_param_group(param_group)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Adam's state (``exp_avg``, ``exp_avg_sq`` per parameter, the groups), the step and warm-up settings, and
        casync's (plan, every rank's error-feedback residuals); collective once compression has started."""
        return {"optimizer": super().state_dict(), "casync": self._sync.state_dict(),
                STATE_KEY: {"step": self._step, "warmup_steps": self.warmup_steps,
                            "bias_correction": self.bias_correction, "exact_variance": self.exact_variance}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (on every rank, before the first step): the run continues bit
        for bit, mid-warm-up or mid-compression."""
        if not isinstance(state_dict, dict) or not {"optimizer", "casync", STATE_KEY} <= set(state_dict):
            raise ValueError(f"expected the output of OneBitAdam.state_dict() (keys 'optimizer', 'casync' and "
                             f"{STATE_KEY!r})")
        if self._step or self._sync.runner is not None:
            raise RuntimeError("load_state_dict() must come before the first step (a fresh OneBitAdam on every rank)")
        saved = state_dict[STATE_KEY]
        for key in ("warmup_steps", "bias_correction", "exact_variance"):
            if saved.get(key, False if key == "exact_variance" else None) != getattr(self, key):
                raise ValueError(f"the checkpoint was saved with {key}={saved.get(key)!r}, this OneBitAdam has "
                                 f"{getattr(self, key)!r}: build it with the saved value to resume exactly")
        step = saved.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"the checkpoint's OneBitAdam step must be an int >= 0, got {step!r}")
        casync_state = state_dict["casync"]
        if isinstance(casync_state, dict) and casync_state.get("iteration") != step:
            raise ValueError(f"the checkpoint's casync state is at step {casync_state.get('iteration')!r} but its "
                             f"OneBitAdam state at {step}: they were not saved together")
        self._sync.load_state_dict(casync_state)
        if self._sync.plan is None:
            raise ValueError("the casync state has no plan")
        self._sync.check_parameters({n: tuple(p.shape) for n, p in self._params})
        saved_names = [g.get("param_names") for g in state_dict["optimizer"].get("param_groups", [])]
        names = [g["param_names"] for g in self.param_groups]
        if saved_names != names:  # torch matches moments to parameters by position: the same order, or none
            at = next((i for i, (a, b) in enumerate(zip(saved_names, names)) if a != b), min(len(names),
                                                                                          len(saved_names)))
            raise ValueError(f"the checkpoint has {len(saved_names)} parameter groups, this OneBitAdam {len(names)}; "
                             f"group {at} differs (saved {(saved_names[at:at + 1] or [None])[0]!r:.200}, now "
                             f"{(names[at:at + 1] or [None])[0]!r:.200}): pass the parameters in the same groups and "
                             "order to resume")
        super().load_state_dict(state_dict["optimizer"])
        if step:
            missing = [n for n, p in self._params if not {"exp_avg", "exp_avg_sq"} <= set(self.state[p])]
            if missing:
                raise ValueError(f"the checkpoint is at step {step} but has no moments for {missing[:4]}")
        self._step = step

    @property
    def plan(self) -> Any:
        """The casync plan the momenta are synchronized with after the warm-up."""
        return self._sync.plan

    def close(self) -> None:
        """Release casync's process groups and shared memory."""
        self._sync.close()

    def __repr__(self) -> str:
        return (f"OneBitAdam(warmup_steps={self.warmup_steps}, bias_correction={self.bias_correction}, "
                f"exact_variance={self.exact_variance}, "
                f"step={self._step}, plan={self._sync.plan!r})")
