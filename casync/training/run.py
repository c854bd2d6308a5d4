"""What one training run of a :class:`casync.Trainer` is built from, checked on the driver before any actor is
involved: the four functions, the options, the plan (and its full-precision twin), the parameter layout and the
JSON config a checkpoint keeps.

``Trainer(...)`` prepares a run and starts actors for it; ``Trainer.restart(...)`` prepares one and hands it to the
actors already running; ``Trainer.load`` and ``Trainer.resume`` prepare one from a checkpoint's config.  Keeping
the preparation in one place is what makes a restarted trainer the one a constructor with the same arguments
builds.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from casync.primitives.codecs import Codec

from ..build import build_plan
from ..engines.state import EngineState
from ..plan.syncplan import SyncPlan
from .checkpoint import read_checkpoint
from .config import codec_from_json, codec_to_json, options_from_json, options_to_json
from .dgc import check_no_momentum, dgc_codecs
from .full_sync import lossless_twin
from .options import TRAIN_BUCKET_BYTES, TrainOptions
from .worker import Layout

#: The constructor's keyword options that are :class:`TrainOptions` fields (the rest go to ``build_plan``).
TRAIN_OPTION_NAMES = frozenset(f.name for f in fields(TrainOptions))


@dataclass(frozen=True)
class Run:
    """A checked training run: everything the actors are set up from, and what a checkpoint records of it."""

    fns: tuple[Callable, Callable, Callable, Callable]  # model_fn, optimizer_fn, loss_fn, data_fn
    options: TrainOptions
    progress: bool
    plan: SyncPlan
    full_plan: SyncPlan | None  # the lossless twin for full_sync_every, else None
    warmup: dict[str, Codec]  # the codecs the DGC warm-up thins out
    layout: Layout
    config: dict[str, Any]  # what Trainer.load needs to rebuild the plan (checkpoint's trainer.json)


def split_options(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(TrainOptions fields, build_plan options)`` of a constructor's keyword options."""
    train = {k: v for k, v in kwargs.items() if k in TRAIN_OPTION_NAMES}
    return train, {k: v for k, v in kwargs.items() if k not in TRAIN_OPTION_NAMES}


def prepare_run(model_fn: Callable, optimizer_fn: Callable, loss_fn: Callable, data_fn: Callable, workers: int,
                strategy: Any, codec: Any, options: TrainOptions, progress: bool, plan_options: dict[str, Any]) -> Run:
    """Check the functions (each callable; ``model_fn`` builds a module, ``optimizer_fn`` an optimizer) and the
    options against each other, and build the plan for ``model_fn``'s model (``build_plan`` with 1 MiB buckets by
    default).  Raises on bad input; starts nothing."""
    for label, fn in (("model_fn", model_fn), ("optimizer_fn", optimizer_fn), ("loss_fn", loss_fn),
                      ("data_fn", data_fn)):
        if not callable(fn):
            raise TypeError(f"{label} must be callable, got {type(fn).__name__}")
    plan_options = dict(plan_options)
    plan_options.setdefault("bucket_bytes", TRAIN_BUCKET_BYTES)
    probe = _probe(model_fn, optimizer_fn, options)
    plan = build_plan(probe, workers=workers, strategy=strategy, codec=codec, seed=options.seed, **plan_options)
    warmup = dgc_codecs(plan, options.momentum_masking, options.warmup_steps)
    full_plan = lossless_twin(plan) if options.full_sync_every else None
    kept, dropped = options_to_json(plan_options)  # a ClusterModel or Profile is saved as a dict
    config = {"workers": workers, "strategy": strategy, "codec": codec_to_json(codec), "plan_options": kept,
              "not_saved": dropped, "options": options.to_dict()}
    layout = [(m.spec.name, m.spec.shape, b.name, m.offset) for b in plan.buckets for m in b.members]
    return Run((model_fn, optimizer_fn, loss_fn, data_fn), options, bool(progress), plan, full_plan, warmup, layout,
               config)


def _probe(model_fn: Callable, optimizer_fn: Callable, options: TrainOptions) -> torch.nn.Module:
    """Build the model once on the driver (for the plan) and check what the functions return."""
    with torch.random.fork_rng():
        torch.manual_seed(options.seed)
        model = model_fn()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model_fn must return a torch.nn.Module, got {type(model).__name__}")
    optimizer = optimizer_fn(model.parameters())
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer_fn must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if options.momentum_correction is not None:
        check_no_momentum(optimizer, "optimizer_fn's optimizer")
    return model


def checkpoint_arguments(path: str | Path, model_fn: Callable, overrides: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(checkpoint, constructor keyword arguments)`` that rebuild the saved trainer's run, ``overrides`` applied.

    Refuses a checkpoint of another model than ``model_fn`` builds, and one whose plan was built with options a
    checkpoint cannot hold (neither JSON nor a ClusterModel or Profile) that ``overrides`` do not give again."""
    ck = read_checkpoint(path)
    _check_same_model(path, ck.model, model_fn)
    config = ck.config
    missing = [key for key in config.get("not_saved", []) if key not in overrides]
    if missing:  # re-planning without them would build another plan, and fail later on its residuals
        raise ValueError(f"{path}: the saved trainer's plan was built with {', '.join(f'{k}=' for k in missing)}, "
                         "which a checkpoint does not hold; pass the same to Trainer.load again")
    kwargs = dict(config["options"], workers=config["workers"], strategy=config["strategy"],
                  codec=codec_from_json(config["codec"]), **options_from_json(config["plan_options"], str(path)))
    kwargs.update(overrides)
    return ck, kwargs


def check_restorable(ck: Any, plan: SyncPlan, options: TrainOptions) -> None:
    """Refuse a checkpoint that a run of ``plan`` with ``options`` cannot take: another worker count, a residual the plan does not
    have (or of another size), a delayed update in flight without ``delayed_update``."""
    if len(ck.workers) != plan.workers:
        raise ValueError(f"the checkpoint holds {len(ck.workers)} workers' state; this trainer has "
                         f"{plan.workers} workers")
    EngineState.from_dict(plan, {"version": 1, "step": ck.step, "workers": plan.workers,
                                 "residuals": ck.residuals})  # validates every residual against the plan
    if ck.pending_step is not None and not options.delayed_update:
        raise ValueError("the checkpoint holds a delayed update in flight; load it with delayed_update=True")


def _check_same_model(path: str | Path, saved: dict[str, np.ndarray], model_fn: Callable) -> None:
    """Refuse, before any actor starts, a checkpoint whose model state has other names or shapes than
    ``model_fn``'s model."""
    with torch.random.fork_rng():
        model = model_fn() if callable(model_fn) else None
    if not isinstance(model, torch.nn.Module):
        return  # the constructor says what is wrong with model_fn
    built = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    stored = {k: tuple(np.shape(v)) for k, v in saved.items()}
    if built != stored:
        diff = sorted(set(built.items()) ^ set(stored.items()))[:4]
        raise ValueError(f"{path}: the checkpoint holds a different model than model_fn builds: (name, shape) "
                         f"differ in {diff}")
