"""``casync.Trainer``: data-parallel training on Ray workers, gradients synchronized through a casync plan.

    trainer = casync.Trainer(model_fn, optimizer_fn, loss_fn, data_fn, workers=4, codec="onebit")
    history = trainer.fit(steps=200)
    trainer.save("ckpt");  trainer = casync.Trainer.load("ckpt", model_fn, optimizer_fn, loss_fn, data_fn)
    trainer.restart(model_fn, optimizer_fn, loss_fn, data_fn, workers=4, codec="topk")   # a new run, same actors
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from casync.primitives.codecs import Codec

from ..engines.nonfinite import NonFiniteReport, raise_if_raising, voids_step
from ..errors import NonFiniteGradientError, ReplicaMismatchError
from .checkpoint import write_checkpoint
from .engine import StepRefs, TrainEngine
from .full_sync import is_full_sync, lossless_twin  # noqa: F401 - lossless_twin: imported from here by tests
from .options import TrainOptions
from .records import History, StepRecord
from .run import Run, check_restorable, checkpoint_arguments, prepare_run, split_options


def _covered(start: float, end: float, intervals: Iterable[tuple[float, float]]) -> float:
    """Length of ``[start, end]`` covered by the union of ``intervals``."""
    total, cursor = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, cursor), min(b, end)
        if b > a:
            total += b - a
            cursor = b
    return total


class Trainer:
    """Train a PyTorch model data-parallel on Ray workers, synchronizing gradients through a casync plan.

    * ``model_fn() -> nn.Module`` is called on every worker (and once on the driver for the plan) under the
      same seed, so every replica starts identical.  ``optimizer_fn(params) -> Optimizer``;
      ``loss_fn(model, batch) -> scalar loss``; ``data_fn(rank, world_size) -> iterable of batches``, this
      worker's shard.  All four are shipped to the workers (cloudpickle).
    * ``workers``, ``strategy``, ``codec`` and ``**plan_options`` go to :func:`casync.build_plan` (so
      ``strategy="auto"``/``codec="auto"`` with ``cluster=...`` use the planner).  ``bucket_bytes`` defaults
      to 1 MiB here, so late layers get buckets of their own and sync while backward continues.
    * ``address``: ``None`` starts (or reuses) an embedded local Ray; ``"auto"`` / ``"ray://..."`` joins one.
    * The keyword-only training options are documented on :class:`~casync.training.options.TrainOptions`.

    Each worker actor holds a replica and its shard; autograd hooks hand each bucket's gradient to the
    bucket's sync tasks as soon as backward produces it; the synchronized gradient is applied by the
    worker's own optimizer.  Parameters are hashed every ``check_every`` steps: replicas that differ raise
    :class:`casync.ReplicaMismatchError`.  Failures raise :class:`casync.SyncError` subclasses (or the
    exception your function raised) within ``timeout_s``; the trainer is unusable afterwards — ``load`` the
    last checkpoint.
    * NaN/Inf in a worker's gradient follow the plan option ``nonfinite``: ``"raise"`` (default) raises
      :class:`casync.NonFiniteGradientError` naming the step, worker and parameter, with every worker's
      parameters, optimizer, residuals and momentum buffers as before that step, so ``fit`` can go on (from
      the next batch) or you ``load`` a checkpoint; ``"skip"`` skips that step's update on every worker (its
      record says ``skipped``); ``"propagate"`` applies the NaN/Inf on every replica alike.
    * :meth:`restart` starts a new run (other functions, plan, options) on the running actors, and :meth:`resume`
      loads a checkpoint there: what a new ``Trainer(...)`` / ``Trainer.load(...)`` gives, without starting actors.
    """

    def __init__(self, model_fn: Callable[[], torch.nn.Module], optimizer_fn: Callable[[Any], torch.optim.Optimizer],
                 loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], data_fn: Callable[[int, int], Iterable],
                 workers: int = 4, strategy: str | list = "ring", codec: str | tuple | Codec | list | None = "onebit",
                 address: str | None = None, *, seed: int = 0, momentum_correction: float | None = None,
                 momentum_masking: bool = False, warmup_steps: int = 0, warmup_start_ratio: float = 0.25,
                 delayed_update: bool = False, full_sync_every: int | None = None, check_every: int = 10,
                 timeout_s: float = 120.0, torch_threads: int = 1, deterministic: bool = True,
                 cpus_per_worker: float = 1.0, placement: str = "spread", transport: str = "direct",
                 compute_threads: int = 1, progress: bool = True, **plan_options: Any):
        options = TrainOptions(
            seed=seed, momentum_correction=momentum_correction, momentum_masking=momentum_masking,
            warmup_steps=warmup_steps, warmup_start_ratio=warmup_start_ratio, delayed_update=delayed_update,
            full_sync_every=full_sync_every, check_every=check_every, timeout_s=timeout_s,
            torch_threads=torch_threads, deterministic=deterministic, cpus_per_worker=cpus_per_worker,
            placement=placement, transport=transport, compute_threads=compute_threads)
        run = prepare_run(model_fn, optimizer_fn, loss_fn, data_fn, workers, strategy, codec, options, progress,
                          plan_options)
        self._take(run)
        self._engine = TrainEngine(run.plan, run.full_plan, run.layout, run.fns, run.options, run.warmup, address)
        try:
            self.check_replicas()  # model_fn must build the same model on every worker
        except BaseException:
            self.close()
            raise

    def _take(self, run: Run) -> None:
        """Make ``run`` this trainer's, at step 0 with an empty history."""
        self.options, self.progress, self.plan = run.options, run.progress, run.plan
        self._fns, self._config = run.fns, run.config
        self.step = 0
        self.history = History()
        self._pending: StepRefs | None = None

    # -- a new run on the same actors ------------------------------------------------------------
    def restart(self, model_fn: Callable[[], torch.nn.Module], optimizer_fn: Callable[[Any], torch.optim.Optimizer],
                loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], data_fn: Callable[[int, int], Iterable],
                workers: int = 4, strategy: str | list = "ring", codec: str | tuple | Codec | list | None = "onebit",
                address: str | None = None, *, progress: bool = True, **options: Any) -> "Trainer":
        """Start a new training run on this trainer's actors: afterwards the trainer is what
        ``Trainer(model_fn, optimizer_fn, loss_fn, data_fn, workers, strategy, codec, address, **options)`` builds
        (the same arguments and defaults; bit-identical training), without starting actors.  Returns ``self``.

        Kept: the actor processes, their placement and CPUs, and the Ray they run on.  Rebuilt: everything else —
        on every actor, as a fresh one (its constructor runs again): replica, optimizer, data shard, RNG states,
        executors, error-feedback residuals, momentum buffers; the data plane (new shared memory, sockets, process
        group); on the driver the plan, step 0, an empty history and timeline.  Nothing of the previous run is
        kept: ``save()`` it first if you need it.

        Refused before anything changes (the trainer goes on as it was): what the constructor refuses (bad
        functions or options: ``TypeError``/``ValueError``); a closed or failed trainer (:class:`casync.SyncError`);
        another worker or server count, ``cpus_per_worker`` or ``placement`` (``ValueError``: the actors and their
        reservations stay those of a fresh trainer); an ``address`` of another Ray cluster (``ValueError``); a dead
        actor (:class:`casync.WorkerLostError`).  A failure after that (model_fn or data_fn raising on a worker,
        replicas that start different, a fault while the data plane forms) leaves the trainer unusable, as a
        failed step does: ``close()`` it."""
        train, plan_options = split_options(options)
        run = prepare_run(model_fn, optimizer_fn, loss_fn, data_fn, workers, strategy, codec, TrainOptions(**train),
                          progress, plan_options)
        self._restart(run, address)
        return self

    def resume(self, path: str | Path, model_fn: Callable, optimizer_fn: Callable, loss_fn: Callable,
               data_fn: Callable, **overrides: Any) -> "Trainer":
        """:meth:`load` on this trainer's actors: afterwards the trainer is what ``Trainer.load(path, model_fn,
        optimizer_fn, loss_fn, data_fn, **overrides)`` returns (continuing it is bit-identical), without starting
        actors.  Returns ``self``.  Kept, rebuilt and refused as by :meth:`restart`; a checkpoint that ``load``
        refuses (missing, corrupted, of another model or worker count, a residual the plan lacks) is refused
        before anything changes too."""
        ck, kwargs = checkpoint_arguments(path, model_fn, overrides)
        address = kwargs.pop("address", None)
        workers, strategy, codec = kwargs.pop("workers"), kwargs.pop("strategy"), kwargs.pop("codec")
        progress = kwargs.pop("progress", True)
        train, plan_options = split_options(kwargs)
        run = prepare_run(model_fn, optimizer_fn, loss_fn, data_fn, workers, strategy, codec, TrainOptions(**train),
                          progress, plan_options)
        check_restorable(ck, run.plan, run.options)
        self._restart(run, address)
        self._restore(ck)
        return self

    def _restart(self, run: Run, address: str | None) -> None:
        self._engine.restart(run.plan, run.full_plan, run.layout, run.fns, run.options, run.warmup, address)
        self._take(run)
        self.check_replicas()

    # -- training --------------------------------------------------------------------------------
    @property
    def workers(self) -> int:
        return self.plan.workers

    def _steps_for(self, steps: int | None, epochs: int | None) -> int:
        if (steps is None) == (epochs is None):
            raise ValueError("fit needs exactly one of steps= or epochs=")
        count = steps if steps is not None else epochs
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{'steps' if steps is not None else 'epochs'} must be a non-negative int, got {count!r}")
        if steps is not None:
            return steps
        lengths = self._engine.call("data_length")
        if any(n is None for n in lengths):
            raise ValueError("epochs= needs data_fn to return iterables with len(); pass steps= instead")
        per_epoch = min(lengths)
        if per_epoch == 0:
            raise ValueError(f"a worker's data shard has no batches (lengths {lengths})")
        return epochs * per_epoch

    def fit(self, steps: int | None = None, epochs: int | None = None, progress: bool | None = None) -> History:
        """Train ``steps`` steps (or ``epochs`` passes over the shortest shard); returns their records.

        Records accumulate in ``trainer.history`` too.  With ``delayed_update`` the last step's update stays
        in flight (applied during the next ``fit``; ``model()`` and ``save()`` account for it)."""
        from tqdm.auto import tqdm

        self._engine.check_usable()
        n = self._steps_for(steps, epochs)
        out = History()
        show = self.progress if progress is None else progress
        with tqdm(total=n, disable=not show, desc=f"casync fit ({self.plan.workers} workers)", unit="step") as bar:
            for _ in range(n):
                for record in self._one_step():
                    out.append(record)
                    self.history.append(record)  # kept even when a later step raises
                    bar.set_postfix(loss=f"{record.loss:.4f}", sync_ms=f"{record.sync_s * 1e3:.1f}",
                                    hidden=f"{record.hidden_fraction:.0%}", refresh=False)
                bar.update(1)
            if self._pending is not None and not self._pending.recorded:
                out.append(self._record_pending())
                self.history.append(out[-1])
        return out

    def _is_full(self, step: int) -> bool:
        return is_full_sync(step, self.options.full_sync_every)

    def _check_step(self, step: int) -> bool:
        return (step + 1) % self.options.check_every == 0

    def _one_step(self) -> list[StepRecord]:
        engine = self._engine
        t = self.step
        start = time.perf_counter()
        deadline = time.monotonic() + self.options.timeout_s
        if not self.options.delayed_update:
            refs = engine.start_step(t, self._is_full(t))
            applied = engine.apply(refs, refs.train, self._check_step(t))
            refs.stats = dict(zip(engine.workers, engine.get(list(refs.train.values()), f"computing step {t}",
                                                             deadline)))
            finished = engine.get(list(refs.finish.values()), f"synchronizing step {t}", deadline)
            updates = engine.get(list(applied.values()), f"applying step {t}", deadline)
            updates = dict(zip(engine.workers, updates))
            voided = self._voided(t, updates, rollback=True)
            raise_if_raising(self.plan.nonfinite, voided, step=t)  # nothing of step t changed: t is run again
            self.step += 1
            refs.wall = time.perf_counter() - start
            record = self._record(refs, dict(zip(engine.actors, finished)), updates, None)
            self._compare_hashes(t, updates)
            return [record]
        prev = self._pending
        refs = engine.start_step(t, self._is_full(t))
        refs.stats = dict(zip(engine.workers, engine.get(list(refs.train.values()), f"computing step {t}", deadline)))
        records = []
        if prev is not None:  # step t-1's update, applied now that step t has its gradients
            applied = engine.apply(prev, refs.train, self._check_step(prev.step))
            updates = dict(zip(engine.workers, engine.get(list(applied.values()), f"applying step {prev.step}",
                                                          deadline)))
            voided = self._voided(prev.step, updates, rollback=False)
            if voided and self.plan.nonfinite == "raise":
                engine.group.fail(f"non-finite gradients in step {prev.step}, and step {t} had already started from "
                             "its error-feedback state (delayed_update)")
                raise NonFiniteGradientError(voided, step=prev.step)
            if not prev.recorded:
                finished = engine.get(list(prev.finish.values()), f"synchronizing step {prev.step}", deadline)
                records.append(self._record(prev, dict(zip(engine.actors, finished)), updates, refs.stats))
            self._compare_hashes(prev.step, updates)
        self._pending = refs
        self.step += 1
        refs.wall = time.perf_counter() - start
        return records

    def _voided(self, step: int, updates: dict[str, dict], rollback: bool) -> list[Any]:
        """The NaN/Inf reports for which every worker voided ``step`` (empty: applied); with ``rollback``
        the dedicated PS servers' residuals go back to before the step, as the workers' already did."""
        voided = [u["voided"] for u in updates.values()]
        if not any(voided):
            return []
        if any(v != voided[0] for v in voided):
            self._engine.group.fail(f"workers disagreed on voiding step {step}")
            raise ReplicaMismatchError(f"step {step}: workers disagree on whether NaN/Inf voided the step: "
                                       f"{dict(zip(updates, voided))}")
        servers = [a for a in self._engine.actors if a not in self._engine.workers]
        if rollback and servers:
            self._engine.call("rollback", step, self.plan.nonfinite == "raise", actors=servers)
        return voided[0]

    def _record_pending(self) -> StepRecord:
        """The record of a delayed step whose update is still in flight (its sync has finished)."""
        refs = self._pending
        finished = self._engine.get(list(refs.finish.values()), f"synchronizing step {refs.step}")
        return self._record(refs, dict(zip(self._engine.actors, finished)), None, None)

    def _record(self, refs: StepRefs, finished: dict[str, dict], updates: dict[str, dict] | None,
                next_stats: dict[str, dict] | None) -> StepRecord:
        """Per-step statistics from the workers' op and compute intervals; also feeds the timeline."""
        syncs, exposed, computes, cpus, rows = [], [], [], [], {}
        for w in self._engine.workers:
            compute = refs.stats[w]["compute"]
            ops = finished[w]["records"]
            rows[w] = list(ops) + list(compute) + ([updates[w]["update"]] if updates else [])
            busy = [(r[3], r[4]) for r in compute] + ([(r[3], r[4]) for r in next_stats[w]["compute"]]
                                                      if next_stats else [])
            computes.append(compute[-1][4] - compute[0][3])
            cpus.append(sum(r[7] for r in ops))  # each op's thread time (the executor records it on every op)
            if ops:
                s0, s1 = min(r[3] for r in ops), max(r[4] for r in ops)
                syncs.append(s1 - s0)
                exposed.append(s1 - s0 - _covered(s0, s1, busy))
        for name in self._engine.actors:
            rows.setdefault(name, list(finished[name]["records"]))
        self._engine.record(refs.step, rows)
        sync_s = float(np.mean(syncs)) if syncs else 0.0
        exposed_s = float(np.mean(exposed)) if exposed else 0.0
        sent = sum(f["sent"] for f in finished.values())
        raw = sum(f["raw"] for f in finished.values())
        samples = sum(s["samples"] for s in refs.stats.values())
        found = [str(r) for w in self._engine.workers for r in finished[w]["nonfinite"]]
        wall = refs.wall
        refs.recorded = True
        return StepRecord(
            step=refs.step, loss=float(np.mean([s["loss"] for s in refs.stats.values()])), samples=samples,
            step_s=wall, throughput=samples / wall if wall else float("nan"), compute_s=float(np.mean(computes)),
            sync_s=sync_s, exposed_sync_s=exposed_s, hidden_fraction=1 - exposed_s / sync_s if sync_s else 0.0,
            bytes_sent=sent, raw_bytes=raw, compression_ratio=raw / sent if sent else float("nan"),
            full_precision=refs.full, density=refs.stats[self._engine.workers[0]]["density"],
            replicas_checked=bool(updates) and any(u["hash"] is not None for u in updates.values()),
            skipped=voids_step(self.plan.nonfinite, found), nonfinite=found, sync_cpu_s=float(np.mean(cpus)))

    # -- replicas ------------------------------------------------------------------------------------
    def _compare_hashes(self, step: int | str, updates: dict[str, dict]) -> None:
        hashes = {w: u["hash"] for w, u in updates.items() if u.get("hash") is not None}
        groups: dict[int, list[str]] = {}
        for w, h in hashes.items():
            groups.setdefault(h, []).append(w)
        if len(groups) > 1:
            majority = max(groups.values(), key=len)
            odd = sorted(w for ws in groups.values() if ws is not majority for w in ws)
            when = f"after step {step}" if isinstance(step, int) else step
            self._engine.group.fail(f"replicas diverged {when}")
            raise ReplicaMismatchError(
                f"{when}: worker(s) {odd} hold parameters different from {majority} "
                f"(CRC-32 {', '.join(f'{w}={h:08x}' for w, h in sorted(hashes.items()))}); replicas must stay "
                "bit-identical (non-deterministic model_fn, or parameters changed outside the optimizer?)")

    def check_replicas(self) -> int:
        """Hash every worker's parameters now; raises :class:`ReplicaMismatchError` if they differ."""
        self._engine.check_usable()
        hashes = self._engine.call("param_hash")
        when = "at start" if self.step == 0 else f"at step {self.step}"
        self._compare_hashes(when, {w: {"hash": h} for w, h in zip(self._engine.workers, hashes)})
        return hashes[0]

    # -- results and state ------------------------------------------------------------------------------
    def model(self) -> torch.nn.Module:
        """Worker 0's model (all replicas are identical), as a fresh module on the driver."""
        self._engine.check_usable()
        reports = list(self._pending.nonfinite.values()) if self._pending is not None else []
        (state,) = self._engine.call("model_state", *reports, actors=["worker:0"])
        with torch.random.fork_rng():
            model = self._fns[0]()
        model.load_state_dict({k: torch.from_numpy(np.array(v, copy=True)) for k, v in state.items()})
        return model

    def timeline(self, step: int | None = None) -> list[dict[str, Any]]:
        """Measured op records (sync ops, forward, backward, update) of the last 16 steps, seconds from the
        first record of the selection."""
        return self._engine.timeline(step)

    def draw_timeline(self, path: str, step: int | None = None) -> str:
        """A Gantt chart PNG of :meth:`timeline`, one lane per actor."""
        from ..drawing import draw_gantt

        label = "all recorded steps" if step is None else f"step {step}"
        return draw_gantt(self.timeline(step), path, title=f"Trainer measured timeline, {label}: {self.plan!r}",
                          actors=self.plan.actors)

    def save(self, path: str | Path) -> Path:
        """Checkpoint everything resuming needs: model, optimizer, error-feedback residuals, momentum buffers,
        a delayed update in flight, step, RNG states and data positions (see ``casync.training.checkpoint``)."""
        engine = self._engine
        engine.check_usable()
        if self._pending is not None and not self._pending.recorded:
            self.history.append(self._record_pending())
        states = engine.get([engine.actors[w].export_state.remote(w == "worker:0") for w in engine.workers],
                            "exporting worker state")
        self._compare_hashes(f"when saving at step {self.step}", {w: {"hash": s["hash"]}
                                                                   for w, s in zip(engine.workers, states)})
        residuals: dict[str, np.ndarray] = {}
        for state in states:
            residuals.update(state["residuals"])
        servers = [a for a in engine.actors if a not in engine.workers]
        for part in (engine.call("get_residuals", actors=servers) if servers else []):
            residuals.update(part)
        return write_checkpoint(path, step=self.step, config=self._config, param_hash=states[0]["hash"],
                                states=states, residuals=residuals)

    @classmethod
    def load(cls, path: str | Path, model_fn: Callable, optimizer_fn: Callable, loss_fn: Callable,
             data_fn: Callable, **overrides: Any) -> "Trainer":
        """A trainer restored from :meth:`save`: continuing it gives what continuing the saved one would have
        (bit-identical under the deterministic settings).  ``overrides``: constructor arguments to change
        (``address``, ``progress``, ``timeout_s``; planner inputs a checkpoint cannot hold: not JSON, nor a
        ClusterModel or Profile)."""
        ck, kwargs = checkpoint_arguments(path, model_fn, overrides)
        trainer = cls(model_fn, optimizer_fn, loss_fn, data_fn, **kwargs)
        try:
            trainer._restore(ck)
        except BaseException:
            trainer.close()
            raise
        return trainer

    def _restore(self, ck: Any) -> None:
        import ray

        engine = self._engine
        check_restorable(ck, self.plan, self.options)
        owner = {a["ef_key"]: a["actor"] for _, a in self.plan.graph.nodes(data=True) if a["op"] == "encode" and a["ef"]}
        by_actor: dict[str, dict[str, np.ndarray]] = {name: {} for name in engine.actors}
        for key, value in ck.residuals.items():
            by_actor[owner[key]][key] = value
        common = ray.put({"model": ck.model, "optimizer": ck.optimizer, "pending_step": ck.pending_step,
                          "pending_results": ck.pending_results})
        refs = [engine.actors[w].import_state.remote(common, dict(ck.workers[r], residuals=by_actor[w]))
                for r, w in enumerate(engine.workers)]
        hashes = engine.get(refs, "restoring worker state")
        servers = [a for a in engine.actors if a not in engine.workers]
        if servers:
            engine.get([engine.actors[s].set_residuals.remote(by_actor[s]) for s in servers], "restoring servers")
        if any(h != ck.param_hash for h in hashes):
            engine.group.fail("restored parameters differ from the checkpoint's")
            raise ReplicaMismatchError(f"restored parameters hash {sorted(set(hashes))}, the checkpoint recorded "
                                       f"{ck.param_hash}: model_fn builds a model whose state does not round-trip")
        self.step = ck.step
        engine.start_at(ck.step)
        if ck.pending_step is not None:  # its NaN/Inf reports decide, as before the save, whether it is voided
            reports = {w: [NonFiniteReport(**r) for r in ck.workers[i].get("pending_nonfinite", [])]
                       for i, w in enumerate(engine.workers)}
            self._pending = StepRefs(step=ck.pending_step, full=False, train={}, finish={}, nonfinite=reports,
                                     recorded=True)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the worker actors (and the embedded Ray if this trainer started it)."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Trainer(workers={self.plan.workers}, step={self.step}, plan={self.plan!r}, "
                f"delayed_update={self.options.delayed_update})")
