"""Strategy labels: the names a strategy comparison gives ways to call :func:`casync.build_plan`.

A label is a strategy's variant (``ring``, ``ps-oneway``, ``ps-twoway``, ``allgather``) or ``auto``, which hands
strategy, partitions and (selective) compression to the planner (it needs the :class:`~casync.ClusterModel` of
the setup).  A fixed label may ask for a number of partitions per bucket (``ring.p8``: the ring with 8
partitions instead of its default), so that partitionings are measured side by side in one run, and a label may
name a data plane (``ring.p8@tcp``).  Plain data, importing nothing of the benchmark, so the grid, the DDP hook
rows and the predictions all read labels the same way.
"""
from __future__ import annotations

from typing import Any, Sequence

from casync.strategies import STRATEGIES as STRATEGY_REGISTRY

#: the data plane the measured rows run on unless a label names another (``ring@objectstore``)
DEFAULT_TRANSPORT = "direct"
TRANSPORTS: tuple[str, ...] = ("direct", "tcp", "gloo", "objectstore")
#: the codec column value of the planner row that may pick any of the grid's codecs per bucket
AUTO_CODEC = "auto"


def strategy_labels() -> dict[str, dict[str, Any]]:
    """Strategy label -> fixed build_plan arguments, from the strategy registry (``auto``: the planner)."""
    labels: dict[str, dict[str, Any]] = {}
    for strategy in STRATEGY_REGISTRY.values():
        labels.update(strategy.variants())
    labels["auto"] = {"strategy": "auto", "partitions": "auto"}
    return labels


def label_arguments(label: str) -> dict[str, Any]:
    """``build_plan`` arguments of a strategy label without its transport: ``"ps-twoway"`` -> ``{"strategy":
    "ps", "two_way": True}``, ``"ring.p8"`` -> ``{"strategy": "ring", "partitions": 8}``; an unknown label or
    a bad partition count raises ValueError naming the choices."""
    labels = strategy_labels()
    base, dot, suffix = label.partition(".")
    if base not in labels:
        raise ValueError(f"unknown strategy label {label!r}; choose from {sorted(labels)}, optionally with a "
                         "partition count (ring.p8)")
    args = dict(labels[base])
    if dot:
        count = suffix[1:]
        if base == "auto" or not suffix.startswith("p") or not count.isdigit() or int(count) < 1 \
                or count != str(int(count)):
            raise ValueError(f"strategy label {label!r}: a fixed strategy takes partitions as '<label>.p<count>' "
                             f"(e.g. {base if base != 'auto' else 'ring'}.p8, count >= 1); 'auto' chooses its own")
        args["partitions"] = int(count)
    return args


def split_transport(label: str) -> tuple[str, str]:
    """``"ring@objectstore"`` -> ``("ring", "objectstore")``; a plain label runs on the default transport."""
    base, _, transport = label.partition("@")
    return base, transport or DEFAULT_TRANSPORT


def auto_strategies(labels: Sequence[str]) -> dict[str, Any]:
    """The planner's strategy arguments for an ``auto`` row beside the fixed rows ``labels`` (a grid's strategy
    labels): the strategies those rows run, so that ``auto`` chooses among what the grid measures, never a strategy
    no fixed row has; ``{}`` (the planner's default candidates) where the grid has no fixed row.  The planner keeps
    one PS direction per plan: two-way where a fixed row is two-way PS, one-way where the PS rows are all one-way."""
    fixed = [label_arguments(split_transport(label)[0]) for label in labels if split_transport(label)[0] != "auto"]
    names = list(dict.fromkeys(args["strategy"] for args in fixed))
    if not names:
        return {}
    out: dict[str, Any] = {"strategy": names}
    directions = {args.get("two_way", True) for args in fixed if args["strategy"] == "ps"}
    if directions == {False}:
        out["two_way"] = False
    return out


def plan_arguments(strategy: str, codec: str, codecs: tuple[str, ...], strategies: Sequence[str] = ()
                   ) -> dict[str, Any]:
    """``build_plan`` keyword arguments for one grid cell (without model, workers or cluster).

    ``auto`` with a codec ``c`` lets the planner choose, per bucket, the strategy, the partitions and
    whether to compress with ``c`` (candidates: none and ``c``); ``auto`` with :data:`AUTO_CODEC` lets it
    choose among all of ``codecs``.  ``strategies``: the grid's strategy labels; ``auto``'s strategy candidates
    are those of its fixed rows (:func:`auto_strategies`).
    """
    strategy = split_transport(strategy)[0]
    args = label_arguments(strategy)
    if strategy == "auto":
        args.update(auto_strategies(strategies))
        if codec == AUTO_CODEC:
            args["codec"] = list(dict.fromkeys(codecs))
        else:
            args["codec"] = list(dict.fromkeys(["none", codec]))
    else:
        if codec == AUTO_CODEC:
            raise ValueError(f"codec {AUTO_CODEC!r} is only for strategy 'auto', not {strategy!r}")
        args["codec"] = None if codec == "none" else codec
    return args
