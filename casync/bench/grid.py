"""What a strategy comparison runs: the strategies, codecs, models and worker counts, and the preset grids
(the strategy labels themselves: :mod:`casync.bench.labels`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from casync.primitives.codecs import get_codec

from .labels import (AUTO_CODEC, DEFAULT_TRANSPORT, TRANSPORTS, label_arguments, plan_arguments, split_transport,
                     strategy_labels)

__all__ = ["AUTO_CODEC", "CODECS", "DEFAULT_TRANSPORT", "FULL", "Grid", "MODELS", "QUICK", "STRATEGIES", "TRANSPORTS",
           "codec_label", "label_arguments", "plan_arguments", "split_transport", "strategy_labels"]


#: the built-in labels (a strategy registered later joins :func:`strategy_labels`)
STRATEGIES: dict[str, dict[str, Any]] = strategy_labels()
CODECS: tuple[str, ...] = ("none", "fp16", "onebit", "terngrad", "topk:ratio=0.01", "randomk:ratio=0.01")
MODELS: tuple[str, ...] = ("resnet50", "vgg16", "bert-base", "gpt2")
WORKERS: tuple[int, ...] = (2, 4)
SIM_WORKERS: tuple[int, ...] = (8, 16, 64)
SIM_BANDWIDTHS_GBPS: tuple[float, ...] = (1.0, 10.0, 25.0, 100.0)


def codec_label(codec: str) -> str:
    """Short column label: ``topk:ratio=0.01`` -> ``topk 1%``."""
    if codec == AUTO_CODEC:
        return "auto"
    c = get_codec(None if codec == "none" else codec)
    ratio = c.params().get("ratio")
    return f"{c.name} {ratio * 100:g}%" if ratio is not None else c.name


@dataclass(frozen=True)
class Grid:
    """The measured grid (models x workers x strategies x codecs, on the engine) and the simulated one
    (the same strategies x codecs x models at ``sim_workers`` x ``sim_bandwidths_gbps``)."""

    models: tuple[str, ...] = MODELS
    workers: tuple[int, ...] = WORKERS
    strategies: tuple[str, ...] = field(default_factory=lambda: tuple(strategy_labels()))
    codecs: tuple[str, ...] = CODECS
    sim_models: tuple[str, ...] | None = None  # None: the measured models
    sim_workers: tuple[int, ...] = SIM_WORKERS
    sim_bandwidths_gbps: tuple[float, ...] = SIM_BANDWIDTHS_GBPS
    baselines: tuple[str, ...] = field(default_factory=lambda: tuple(_baseline_names()))
    #: data planes every measured strategy runs on (``DEFAULT_TRANSPORT`` rows keep the plain label, the others
    #: are labelled ``strategy@transport``); the simulated grid models the default one
    transports: tuple[str, ...] = (DEFAULT_TRANSPORT,)
    #: simulate ``auto`` once per codec (planner candidates none + that codec) besides the all-codecs row;
    #: False keeps only the all-codecs row (each planner call takes seconds at 64 workers)
    sim_auto_per_codec: bool = True
    #: "DDP + casync hook" rows (``casync.bench.hooks``): ``("all",)`` = every measured strategy label except
    #: ``auto`` x every codec; or ``"label/codec"`` entries (``"ring/onebit"``); ``()`` none
    hooks: tuple[str, ...] = ("all",)
    #: ops each casync actor (RayEngine's, and each rank of a DDP + casync hook row) runs at once
    #: (``compute_threads``); the predictions of the RayEngine rows simulate as many compute lanes per actor
    compute_threads: int = 1

    def __post_init__(self) -> None:
        from ..engines.inputs import check_compute_threads

        check_compute_threads(self.compute_threads, "Grid")
        if self.compute_threads > 1 and "objectstore" in self.transports:
            raise ValueError("compute_threads > 1 needs a direct data plane; the objectstore transport runs one Ray "
                             "task at a time per actor (measure it in a run of its own)")
        for s in self.strategies:
            label_arguments(s)  # names what is wrong
        for transport in self.transports:
            if transport not in TRANSPORTS:
                raise ValueError(f"unknown transport {transport!r}; choose from {list(TRANSPORTS)}")
        for c in self.codecs:
            get_codec(None if c == "none" else c)  # validates, naming the registered codecs
        for w in tuple(self.workers) + tuple(self.sim_workers):
            if isinstance(w, bool) or not isinstance(w, int) or w < 2:
                raise ValueError(f"worker counts must be ints >= 2, got {w!r}")
        for bw in self.sim_bandwidths_gbps:  # checked here, not after the measured grid has run for minutes
            if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw) or bw <= 0:
                raise ValueError(f"simulated bandwidths must be finite numbers of Gbps > 0, got {bw!r}")
        from ..plan.models import model_names

        known = set(model_names())
        for m in tuple(self.models) + tuple(self.sim_models or ()):
            if m not in known:
                raise ValueError(f"unknown model {m!r}; built-in models: {sorted(known)}")
        unknown = set(self.baselines) - set(_baseline_names())
        if unknown:
            raise ValueError(f"unknown baseline(s) {sorted(unknown)}; choose from {_baseline_names()}")
        from .hooks import hook_arguments

        for name in self.hook_variants():
            hook_arguments(name)  # names what is wrong

    def cells(self) -> list[tuple[str, int, str, str]]:
        """Measured cells (model, workers, strategy, codec); ``auto`` also gets the all-codecs row."""
        out = []
        for model in self.models:
            for workers in self.workers:
                for transport in self.transports:
                    for strategy in self.strategies:
                        codecs = self.codecs + ((AUTO_CODEC,) if strategy == "auto" and len(self.codecs) > 1 else ())
                        label = strategy if transport == DEFAULT_TRANSPORT else f"{strategy}@{transport}"
                        out += [(model, workers, label, c) for c in codecs]
        return out

    def sim_cells(self) -> list[tuple[str, int, float, str, str]]:
        """Simulated cells (model, workers, bandwidth Gbps, strategy, codec)."""
        out = []
        for model in self.sim_models if self.sim_models is not None else self.models:
            for workers in self.sim_workers:
                for bw in self.sim_bandwidths_gbps:
                    for strategy in self.strategies:
                        codecs = self.codecs + ((AUTO_CODEC,) if strategy == "auto" and len(self.codecs) > 1 else ())
                        if strategy == "auto" and not self.sim_auto_per_codec and len(self.codecs) > 1:
                            codecs = (AUTO_CODEC,)
                        out += [(model, workers, bw, strategy, c) for c in codecs]
        return out

    def hook_variants(self) -> list[str]:
        """The "DDP + casync hook" rows' names (``ddp-casync:<label>:<codec>``) of this grid."""
        from .hooks import hook_variant

        if tuple(self.hooks) == ("all",):
            labels = [s for s in self.strategies if split_transport(s)[0] != "auto" and "@" not in s]
            return [hook_variant(s, c) for s in labels for c in self.codecs]
        out = []
        for entry in self.hooks:
            label, sep, codec = entry.partition("/")
            if not sep or not label or not codec:
                raise ValueError(f"a hook row is 'strategy/codec' (e.g. ring/onebit), or 'all', got {entry!r}")
            out.append(hook_variant(label, codec))
        return out

    def with_(self, **changes: Any) -> "Grid":
        return replace(self, **changes)


def _baseline_names() -> list[str]:
    from .baselines import BASELINES

    return list(BASELINES)


FULL = Grid()
#: about 3 minutes on 2 cores: ResNet-50, 4 workers, four codecs, every strategy, every baseline, two
#: configurations through the DDP hook; simulated at 16 and 64 workers on 1, 10 and 100 Gbps (auto: the
#: all-codecs planner only)
QUICK = Grid(models=("resnet50",), workers=(4,), codecs=("none", "fp16", "onebit", "randomk:ratio=0.01"),
             sim_workers=(16, 64), sim_bandwidths_gbps=(1.0, 10.0, 100.0), sim_auto_per_codec=False,
             hooks=("ring/onebit", "ps-twoway/randomk:ratio=0.01"))
