"""What casync keeps in a PyTorch job: options, its process groups, the plan, the step and the residuals.

:class:`SyncState` is shared by the DDP hook's :class:`CasyncState` and by ``DistributedOptimizer``: it creates
casync's process groups on first use, starts the plan's runner, guards consistency (at the first sync all
ranks compare plan fingerprints; every ``check_every`` steps they compare parameter CRCs) and saves / restores
exactly.  A state dict holds the plan (JSON), the number of steps done and every rank's error-feedback
residuals keyed by role and parameter name (``casync.torch.residuals``), and with DGC's momentum correction
every rank's momentum buffers and the keepers' options (``casync.torch.keepers``); it is gathered from every
rank, so one rank's checkpoint file resumes all of them.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

from ..engines.inputs import check_compute_threads
from ..errors import SyncError
from ..plan.syncplan import SyncPlan
from ..training.dgc import check_no_momentum
from ..training.full_sync import lossless_twin
from .group import CasyncGroup
from .keepers import KeeperOptions, LocalKeepers, check_saved_config, refuse_in_hook
from .plans import SyncOptions
from .residuals import check_named, from_named, to_named
from .runner import (PlanRunner, check_replicas, check_same_plan, check_same_settings, parameters_crc,
                     plan_fingerprint)

STATE_FORMAT = "casync.torch"
STATE_VERSION = 1


def plan_mismatch(differences: list[str]) -> ValueError:
    """The error for a plan (a checkpoint's) that does not sync the parameters DDP or the optimizer hands over."""
    return ValueError("the casync plan (from the checkpoint) does not fit this model's gradients: "
                      + "; ".join(differences) + ". Resume with the same model (and requires_grad flags), or leave "
                      "casync's state out")


class SyncState:
    """casync's side of one training job on this rank (see the module docstring)."""

    def __init__(self, options: SyncOptions, process_group: Any = None, timeout_s: float = 60.0,
                 transport: str = "direct", check_every: int = 10, compute_threads: int = 1, start_iter: int = 0,
                 keepers: KeeperOptions | None = None):
        if not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and 0 < timeout_s < 1e9):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        if transport not in ("direct", "gloo"):
            raise ValueError(f"transport must be 'direct' (shared memory between ranks of one machine, gloo between "
                             f"machines) or 'gloo', got {transport!r}")
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 0:
            raise ValueError(f"check_every must be an int >= 0 (0: never compare parameters), got {check_every!r}")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"start_iter must be an int >= 0, got {start_iter!r}")
        self.options = options
        self.start_iter = start_iter  # the first start_iter steps sync uncompressed
        self.keeper_options = keepers if keepers is not None else KeeperOptions()
        self.keepers: LocalKeepers | None = None  # made by the owner once it knows the parameters and ranks
        self.full_steps = False  # whether some steps run the plan's uncompressed twin (the runner then has it)
        self._saved_momentum: dict[str, dict[str, Any]] = {}  # role -> buffers, loaded before the keepers exist
        self.compute_threads = check_compute_threads(compute_threads)
        self.process_group = process_group
        self.timeout_s = float(timeout_s)
        self.transport = transport
        self.check_every = check_every
        self.iter = 0  # steps done (every sync counts, uncompressed ones included: codec seeds follow it)
        self.plan: SyncPlan | None = None
        self.group: CasyncGroup | None = None
        self.runner: PlanRunner | None = None
        self.error: BaseException | None = None  # the failure that made this state unusable
        self._saved: dict[str, dict[str, np.ndarray]] = {}  # residuals loaded before the runner exists
        self._checked = False

    # -- lifecycle -------------------------------------------------------------------------------------------
    def ensure_group(self) -> CasyncGroup:
        """casync's process groups (created on first use: every rank reaches this point together)."""
        if self.group is None:
            group = CasyncGroup(self.process_group, self.timeout_s, self.transport)
            check_same_settings(group, self.settings())
            self.group = group
        return self.group

    def settings(self) -> dict[str, Any]:
        """What every rank must set alike besides the plan's options (first compared when the groups form, so a
        difference is an error naming it, not a timeout in a collective that only some ranks make)."""
        return {"transport": self.transport, "check_every": self.check_every, "start_iter": self.start_iter,
                "keepers": self.keeper_options.config(),
                # what load_state_dict() restored (a checkpoint loaded on some ranks only, or different ones)
                "steps done (load_state_dict)": self.iter,
                "plan (load_state_dict)": plan_fingerprint(self.plan, self.options.config()) if self.plan else None}

    def ensure_runner(self) -> PlanRunner:
        """The plan's runner on this rank, with the residuals a checkpoint restored."""
        if self.runner is None:
            if self.plan is None:
                raise SyncError("no plan yet")
            group = self.ensure_group()
            if self.plan.workers != group.world:
                raise ValueError(f"the plan (from the checkpoint) syncs {self.plan.workers} ranks but this job has "
                                 f"{group.world}; resume with the same number of ranks, or start casync's state anew")
            runner = PlanRunner(self.plan, group, compute_threads=self.compute_threads,
                                full_plan=lossless_twin(self.plan) if self.full_steps else None)
            runner.set_residuals(from_named(self.plan, self._saved, runner.actor))
            self._saved = {}
            self.runner = runner
        return self.runner

    def check_usable(self) -> None:
        if self.error is not None:
            raise SyncError(f"casync failed earlier ({type(self.error).__name__}: {self.error}); this state is "
                            "unusable: restart from the last checkpoint") from self.error

    def fail(self, exc: BaseException) -> BaseException:
        """Remember the failure that makes this state unusable, and fail the step in flight with it (its peers
        are told at once, not at their timeout); returns it."""
        if self.error is None:
            self.error = exc
        if self.runner is not None:
            self.runner.abort(exc)
        return exc

    # -- the consistency guard ---------------------------------------------------------------------------------
    def check_plan_once(self) -> None:
        """At the first compressed sync of this process: all ranks must have built the same plan."""
        if self._checked:
            return
        plan = self.plan
        describe = f"{len(plan.buckets)} buckets, {len(plan.tensors)} tensors, " \
                   f"{sorted({b.strategy for b in plan.buckets})} / {sorted({b.codec.name for b in plan.buckets})}"
        check_same_plan(self.ensure_group(), plan_fingerprint(plan, self.options.config()), describe, self.iter)
        self._checked = True

    def check_params(self, step: int, tensors: Sequence[Any], took_step: bool = True) -> None:
        """The replicas' parameters (``tensors`` in the plan's order) must agree on every rank that took the step
        (collective; ``took_step=False``: this rank joined, see :func:`~casync.torch.runner.check_replicas`)."""
        check_replicas(self.ensure_group(), parameters_crc(tensors) if took_step else None, step)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _residual_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """Every rank's residuals by role and parameter (a collective call once the runner exists)."""
        if self.runner is None:
            return self._saved
        mine = to_named(self.plan, self.runner.residuals)
        merged: dict[str, dict[str, np.ndarray]] = {}
        for part in self.runner.group.gather_object(mine, "gathering error-feedback residuals for state_dict()"):
            merged.update(part)
        return merged

    def make_keepers(self, params: Mapping[str, Any]) -> LocalKeepers:
        """This rank's DGC state for ``params`` (name -> parameter), with the momentum buffers a checkpoint
        restored (the group must exist: they are kept by role ``worker:<rank>``)."""
        group = self.ensure_group()
        keepers = LocalKeepers(self.keeper_options, params, group.world)
        role = f"worker:{group.rank}"
        if self._saved_momentum:
            keepers.load(self._saved_momentum.get(role, {}), role)
        self._saved_momentum = {}
        self.keepers = keepers
        return keepers

    def _momentum(self) -> dict[str, dict[str, Any]]:
        """Every rank's momentum buffers by role (collective once the group exists and momentum is on)."""
        if self.keeper_options.momentum_correction is None:
            return {}
        if self.keepers is None or self.group is None:
            return self._saved_momentum
        merged: dict[str, dict[str, Any]] = {}
        for part in self.group.gather_object({f"worker:{self.group.rank}": self.keepers.state()},
                                             "gathering momentum-correction buffers for state_dict()"):
            merged.update(part)
        return merged

    def state_dict(self) -> dict[str, Any]:
        """The plan, the steps done and every rank's residuals by parameter name (tensors shaped like the
        parameters).  Collective once syncing has started: call it on every rank, save it from any one."""
        import torch

        self.check_usable()
        shapes = {t.name: t.shape for t in self.plan.tensors} if self.plan is not None else {}
        residuals = {role: {name: torch.from_numpy(np.array(a, copy=True)).reshape(shapes.get(name, a.shape))
                            for name, a in sorted(params.items())}
                     for role, params in sorted(self._residual_arrays().items())}
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "iteration": self.iter,
                "plan": json.dumps(self.plan.to_dict(), separators=(",", ":")) if self.plan is not None else None,
                "config": self.options.config(), "residuals": residuals,
                "keepers": {"config": self.keeper_options.config(), "momentum": self._momentum()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (on every rank, before the first sync).  The saved plan is
        used from the first step on, whatever bucket layout the model has now; options that differ from the
        saved ones, a plan for other parameters or another number of ranks are refused, naming the difference."""
        if self.runner is not None or self.iter:
            raise RuntimeError("load_state_dict() must come before the first sync (a fresh state on every rank)")
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a casync.torch state dict (format {state.get('format') if isinstance(state, Mapping) else type(state).__name__!r}); "
                             "pass what state_dict() returned")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"casync.torch state version {state.get('version')!r} is not supported "
                             f"(expected {STATE_VERSION})")
        iteration = state.get("iteration")
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"state 'iteration' must be an int >= 0, got {iteration!r}")
        config = self.options.config()
        saved = state.get("config") or {}
        differ = sorted(k for k in config if k in saved and _norm(saved[k]) != _norm(config[k]))
        if differ:
            raise ValueError("the checkpoint was saved with other casync options: " + ", ".join(
                f"{k}={saved[k]!r} (now {config[k]!r})" for k in differ) + "; build the state with the saved "
                "options to resume exactly, or leave casync's state out to start a new plan")
        keepers = state.get("keepers") or {}
        check_saved_config(keepers.get("config"), self.keeper_options)
        momentum = keepers.get("momentum") or {}
        if not isinstance(momentum, Mapping) or not all(isinstance(v, Mapping) for v in momentum.values()):
            raise TypeError("the state's momentum buffers must map role -> {parameter: tensor}")
        plan = None
        if state.get("plan") is not None:
            plan = SyncPlan.from_dict(json.loads(state["plan"]), source="casync.torch state dict")
        residuals = check_named(plan, state.get("residuals") or {}) if plan is not None else {}
        if state.get("residuals") and plan is None:
            raise ValueError("the state has residuals but no plan")
        self.plan, self.iter, self._saved = plan, iteration, residuals
        self._saved_momentum = {role: dict(buffers) for role, buffers in momentum.items()}
        if self.keepers is not None:  # made already (DistributedOptimizer's): restore into it
            role = f"worker:{self.ensure_group().rank}"
            if self._saved_momentum:
                self.keepers.load(self._saved_momentum.get(role, {}), role)
            self._saved_momentum = {}
        self._checked = False

    def check_parameters(self, params: Mapping[str, tuple[int, ...]],
                         maybe: Mapping[str, tuple[int, ...]] | None = None) -> None:
        """The plan (a checkpoint's) must sync exactly these parameters (name -> shape): explain any difference.
        ``maybe``: parameters the plan may sync too (frozen after DDP bucketed them; the caller checks that they
        arrive)."""
        plan_shapes = {t.name: tuple(t.shape) for t in self.plan.tensors}
        params = dict(params)
        for name, shape in (maybe or {}).items():
            if plan_shapes.get(name) == shape:
                params[name] = shape
        if plan_shapes == params:
            return
        missing = sorted(set(plan_shapes) - set(params))
        extra = sorted(set(params) - set(plan_shapes))
        shape = sorted(n for n in set(plan_shapes) & set(params) if plan_shapes[n] != params[n])
        raise plan_mismatch([s for s in (
            f"parameters in the plan but not synced now: {missing[:5]}" if missing else "",
            f"parameters synced now but not in the plan: {extra[:5]}" if extra else "",
            "other shapes: " + ", ".join(f"{n} {plan_shapes[n]} -> {params[n]}" for n in shape[:5]) if shape else "")
            if s])

    def close(self) -> None:
        """Release shared memory (the state is unusable afterwards)."""
        if self.runner is not None:
            self.runner.close()
        if self.group is not None:
            self.group.close()


def _norm(value: Any) -> Any:
    """Options as JSON sees them (tuples and lists alike)."""
    return json.loads(json.dumps(value, default=str))


class CasyncState(SyncState):
    """State of ``casync.torch.comm_hook`` for ``ddp.register_comm_hook(state, comm_hook)``.

    ``process_group``: the ranks DDP syncs over (None: the default group); casync makes its own groups over
    them with ``timeout_s``.  ``strategy`` / ``codec`` / ``error_feedback`` / ``**plan_options``
    (``partitions``, ``two_way``, ``op``, ``seed``; ``cluster``, ``profile``, ``ready_times`` and
    ``bucket_bytes`` with ``"auto"``) are :func:`casync.build_plan`'s; ``"auto"`` chooses per DDP bucket, for the
    times DDP handed the buckets over in the iteration whose layout the plan takes (``ready_times=`` overrides
    them; ``bucket_bytes=`` has the planner fuse buckets of its own).  The first iterations sync uncompressed
    (an all-reduce on casync's group) until DDP has rebuilt its buckets (in its second iteration, the third with
    ``static_graph``; the plan then uses those buckets) and until ``start_iter``; they count as steps.
    ``min_compress_bytes``: smaller buckets stay uncompressed.  DGC's accuracy keepers (``casync.torch.keepers``;
    every iteration, the uncompressed ones included): ``dgc_clip_norm`` (local clipping of the rank's gradient
    to a global L2 norm of ``dgc_clip_norm / sqrt(N)``: the hook then holds every bucket until DDP hands over the
    iteration's last, and backward no longer overlaps the sync), ``momentum_correction=m`` (each rank syncs
    ``u = m*u + g``; the optimizer must have no momentum: ``optimizer=`` is checked, or the optimizers holding the
    model's parameters are found at the first iteration), ``momentum_masking`` (``u = 0`` where the rank's residual
    is zero after a compressed iteration; sparse codecs with error feedback), ``warmup_steps`` /
    ``warmup_start_ratio`` (a sparse codec keeps ``start * (ratio/start)**(i/warmup_steps)`` of the elements at
    iteration ``i``, counted as ``state.iter``).  ``delayed_update``, ``local_compensation`` and
    ``full_sync_every`` are refused (``HOOK_REFUSED`` says why).  ``nonfinite``: ``"propagate"`` (default: a
    GradScaler sees the overflow and skips the step) or ``"skip"`` (every rank gets zeros, residuals
    unchanged); ``"raise"`` is refused, since an exception inside backward leaves DDP unusable.  ``check_every``: compare the replicas' parameters every that many
    steps (0: never).  ``model``: the DDP module (or its wrapped module), to name parameters; by default the
    hook finds the DDP module it is registered on.  ``transport``: ``"direct"`` (shared memory between ranks of
    one machine) or ``"gloo"``.  ``compute_threads``: ops a rank runs at once (``RayEngine``'s meaning; give
    more than 1 only where a rank has cores to spare beside its training threads).
    """

    def __init__(self, process_group: Any = None, strategy: Any = "ring", codec: Any = "onebit",
                 error_feedback: bool | str = "auto", start_iter: int = 0, min_compress_bytes: int = 0,
                 nonfinite: str = "propagate", *, model: Any = None, timeout_s: float = 60.0,
                 check_every: int = 10, transport: str = "direct", compute_threads: int = 1,
                 dgc_clip_norm: float | None = None, momentum_correction: float | None = None,
                 momentum_masking: bool = False, warmup_steps: int = 0, warmup_start_ratio: float = 0.25,
                 optimizer: Any = None, **plan_options: Any):
        refuse_in_hook(plan_options)
        options = SyncOptions.make(strategy, codec, error_feedback, min_compress_bytes, nonfinite, plan_options,
                                   fixed_buckets=True)
        if nonfinite == "raise":
            raise ValueError("nonfinite='raise' cannot be used in a DDP comm hook: an exception inside backward leaves "
                             "DDP's reducer unusable; use 'propagate' (a GradScaler then skips the step) or 'skip'")
        keepers = KeeperOptions(dgc_clip_norm=dgc_clip_norm, momentum_correction=momentum_correction,
                                momentum_masking=momentum_masking, warmup_steps=warmup_steps,
                                warmup_start_ratio=warmup_start_ratio)
        if not options.planned:
            keepers.check_codec(codec, error_feedback)
        if optimizer is not None and momentum_correction is not None:
            check_no_momentum(optimizer)
        super().__init__(options, process_group, timeout_s, transport, check_every, compute_threads, start_iter,
                         keepers)
        self.model = model
        self.optimizer_checked = optimizer is not None
        self.session: Any = None  # casync.torch.hook's per-process bookkeeping, made at the first hook call

    def timeline(self) -> list[dict[str, Any]]:
        """This rank's per-op rows of the last compressed iteration (``RayEngine.timeline``'s fields, times in
        ``time.time()`` seconds) and a ``backward`` row from its first compressed bucket to the last bucket DDP
        handed over; empty before the first compressed iteration."""
        return self.session.rows() if self.session is not None else []

    @property
    def compressing(self) -> bool:
        """Whether the next iteration runs the plan (rather than the uncompressed warm-up all-reduce)."""
        return self.plan is not None and self.iter >= self.start_iter

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a CasyncState holds process groups and threads; save state.state_dict() instead")
