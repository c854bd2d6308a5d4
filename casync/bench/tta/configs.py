"""The time-to-accuracy mode's configurations, as plain data in one registry.

A configuration is one way to train the task's model on the ranks: a DDP row of the bench (PyTorch's allreduce,
fp16 and PowerSGD hooks, casync's comm hook ``ddp-casync:<strategy label>:<codec>``, the hook without
communication), or a casync optimizer (``DistributedOptimizer`` or another class of ``casync.torch``) in place of
DDP.  ``options`` are extra keyword arguments of the ``CasyncState`` (hook rows) or of the optimizer class, so an
accuracy keeper (DGC's clipping and momentum correction, CD-SGD's compensation) is one more entry there;
``param_groups`` are values set on the task's optimizer (SGD without momentum where the hook keeps DGC's
momentum instead).  An option's value may be relative to the run: ``"10%"`` is that share of its steps (at least
1), ``"lr"`` its learning rate (:func:`run_options`).  A configuration whose class or option this casync does not
have is left out of the defaults, and naming it is an error that says what is missing.
"""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import Any

from ..baselines import BASELINES, NO_COMMUNICATION
from ..hooks import hook_variant, is_hook

#: the configuration the target is taken from, and the Δ column is against
REFERENCE = "allreduce"
#: PyTorch's own hooks: the "× fastest PyTorch hook" column is against the fastest of these reaching the target
TORCH_HOOKS = ("allreduce", "fp16", "powersgd-r1", "powersgd-r4")
FLOOR = "nocomm"


@dataclass(frozen=True)
class Config:
    """One configuration (see the module docstring); ``system`` is ``"torch hook"``, ``"casync hook"``,
    ``"casync optimizer"`` or ``"floor"``."""

    name: str
    system: str
    description: str
    variant: str | None = None          # the bench's DDP row (hooks and the floor)
    optimizer: str | None = None        # a casync.torch class used instead of DDP ("DistributedOptimizer", ...)
    options: dict[str, Any] = field(default_factory=dict)
    param_groups: dict[str, Any] = field(default_factory=dict)
    tasks: tuple[str, ...] = ()         # the tasks it is for (empty: every task)
    in_default: bool = True             # whether a run without --configs includes it (where it can run)

    @property
    def evaluated(self) -> bool:
        """Whether its accuracy means anything (the floor's replicas diverge: it is timed only)."""
        return self.system != "floor"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _hook(name: str, label: str, codec: str, description: str, **options: Any) -> Config:
    return Config(name, "casync hook", description, variant=hook_variant(label, codec),
                  options={"error_feedback": True, **options} if label != "auto" else options)


#: DGC's keepers in the hook: local clipping, momentum correction with momentum-factor masking (the task's SGD then
#: runs without momentum).  The image task trains without clipping, so the threshold is set to leave its
#: uncompressed run's gradients alone: casync scales it by N^-1/2, and 24 / sqrt(4) = 12 clips 1 % of the 4 ranks'
#: gradient norms along allreduce's trajectory (benchmarks/grad_norms.py, median 3.5; the first guess, 5.0, clipped
#: most steps: benchmarks/results/time_to_accuracy/tuning/grad_norms_image.md)
DGC_OPTIONS = {"dgc_clip_norm": 24.0, "momentum_correction": 0.9, "momentum_masking": True}
#: CD-SGD's delayed update in DistributedOptimizer, without and with the local update compensation
DELAYED_OPTIONS = {"strategy": "ring", "codec": "onebit", "error_feedback": True, "delayed_update": True}

CONFIGS: dict[str, Config] = {c.name: c for c in (
    Config("allreduce", "torch hook", BASELINES["ddp"], variant="ddp"),
    Config("fp16", "torch hook", BASELINES["ddp-fp16"], variant="ddp-fp16"),
    Config("powersgd-r1", "torch hook", BASELINES["ddp-powersgd-r1"], variant="ddp-powersgd-r1"),
    Config("powersgd-r4", "torch hook", BASELINES["ddp-powersgd-r4"], variant="ddp-powersgd-r4"),
    _hook("ring/onebit", "ring", "onebit", "casync hook: ring, onebit with error feedback"),
    _hook("ps-twoway/onebit", "ps-twoway", "onebit", "casync hook: two-way PS, onebit with error feedback"),
    Config("ring/onebit+mc", "casync hook", "casync hook: ring, onebit with error feedback and DGC's momentum "
           "correction (momentum on each rank before compression; the task's SGD without momentum)",
           variant=hook_variant("ring", "onebit"), options={"error_feedback": True, "momentum_correction": 0.9},
           param_groups={"momentum": 0.0}, tasks=("image",)),
    _hook("allgather/topk1%", "allgather", "topk:ratio=0.01", "casync hook: allgather, top-k 1 % with error feedback"),
    Config("allgather/topk1%+dgc", "casync hook", "casync hook: allgather, top-k 1 % with error feedback, DGC's local "
           "clipping and momentum correction", variant=hook_variant("allgather", "topk:ratio=0.01"),
           options={"error_feedback": True, **DGC_OPTIONS}, param_groups={"momentum": 0.0}, tasks=("image",)),
    _hook("auto/onebit", "auto", "onebit", "casync hook: the planner per DDP bucket (onebit or none), for the "
          "setup's cluster model"),
    Config("onebit-adam", "casync optimizer", "casync.torch.OneBitAdam: Adam's warm-up, then the variance frozen "
           "and the momentum synced onebit with error feedback", optimizer="OneBitAdam",
           options={"strategy": "ps", "two_way": True, "codec": "onebit", "warmup_steps": "10%"}, tasks=("lm",)),
    Config("onebit-adam+exact", "casync optimizer", "casync.torch.OneBitAdam as onebit-adam, but one bucket per "
           "tensor and only those of 8 MiB or more compressed (the LM's input embedding); the rest (decoder, LSTM) "
           "synced exactly and kept on Adam's own variance (exact_variance)", optimizer="OneBitAdam",
           options={"strategy": "ps", "two_way": True, "codec": "onebit", "warmup_steps": "10%", "bucket_bytes": 0,
                    "min_compress_bytes": 8 << 20, "exact_variance": True}, tasks=("lm",)),
    Config("opt-ring/onebit", "casync optimizer", "casync DistributedOptimizer: ring, onebit with error feedback",
           optimizer="DistributedOptimizer", options={"strategy": "ring", "codec": "onebit", "error_feedback": True},
           in_default=False),
    Config("delayed/onebit", "casync optimizer", "casync DistributedOptimizer: CD-SGD's delayed update, ring, onebit "
           "with error feedback, no compensation", optimizer="DistributedOptimizer", options=dict(DELAYED_OPTIONS)),
    Config("cdsgd/onebit", "casync optimizer", "casync DistributedOptimizer: CD-SGD's delayed update with the local "
           "update compensation, ring, onebit with error feedback", optimizer="DistributedOptimizer",
           options={**DELAYED_OPTIONS, "local_compensation": "lr"}),
    Config(FLOOR, "floor", BASELINES[NO_COMMUNICATION] + ": step time only, its replicas diverge",
           variant=NO_COMMUNICATION),
)}


def missing(config: Config) -> str | None:
    """Why this casync cannot run ``config`` (a class or keyword argument it lacks), or None if it can."""
    if config.optimizer is not None:
        import casync.torch as ct

        cls = getattr(ct, config.optimizer, None)
        if cls is None:
            return f"casync.torch.{config.optimizer}, which this casync does not have (issue #43, section 3)"
        return _unknown_options(cls, config.options, f"casync.torch.{config.optimizer}")
    if config.variant is not None and is_hook(config.variant):
        from casync.torch import CasyncState

        return _unknown_options(CasyncState, config.options, "CasyncState")
    return None


def _unknown_options(cls: type, options: dict[str, Any], where: str) -> str | None:
    """The options ``cls(...)`` does not name as parameters (those it takes only through ``**kwargs`` count as
    unknown: a keeper's option must be a parameter of its own)."""
    params = inspect.signature(cls).parameters
    plan = {"partitions", "two_way", "op", "seed", "cluster", "profile", "ready_times", "bucket_bytes"}
    unknown = sorted(k for k in options if k not in params and k not in plan)
    return f"{where} option(s) {unknown}, which this casync does not have (issue #43, section 3)" if unknown else None


def run_options(options: dict[str, Any], steps: int, lr: float) -> dict[str, Any]:
    """``options`` for a run of ``steps`` steps at learning rate ``lr``: ``"N%"`` -> N % of the steps (at least 1),
    ``"lr"`` -> ``lr``; other values as they are."""
    out = {}
    for key, value in options.items():
        if isinstance(value, str) and value.endswith("%"):
            value = max(1, round(float(value[:-1]) / 100 * steps))
        elif value == "lr":
            value = lr
        out[key] = value
    return out


def applies(config: Config, task: str) -> bool:
    return not config.tasks or task in config.tasks


def default_configs(task: str) -> list[Config]:
    """Every default configuration for ``task`` that this casync can run, in the registry's order."""
    return [c for c in CONFIGS.values() if c.in_default and applies(c, task) and missing(c) is None]


def resolve(names: list[str] | None, task: str) -> list[Config]:
    """The configurations ``names`` (None: the defaults for ``task``); an unknown name, one for another task, a
    repeated one, or one this casync cannot run raises ValueError saying which and why."""
    if names is None:
        return default_configs(task)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; choose from {', '.join(CONFIGS)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"configuration(s) {repeated} named twice")
    out = []
    for name in names:
        config = CONFIGS[name]
        if not applies(config, task):
            raise ValueError(f"configuration {name!r} is for the {'/'.join(config.tasks)} task, not {task!r}")
        why = missing(config)
        if why is not None:
            raise ValueError(f"configuration {name!r} needs {why}")
        out.append(config)
    if not out:
        raise ValueError("no configuration named (an empty --configs?)")
    return out


def listing(task: str | None = None) -> list[list[str]]:
    """Rows ``[name, system, tasks, available, description]`` for ``--list-configs``."""
    rows = []
    for c in CONFIGS.values():
        if task is None or applies(c, task):
            why = missing(c)
            rows.append([c.name, c.system, "/".join(c.tasks) or "all", "yes" if why is None else "no: needs " + why,
                         c.description])
    return rows
