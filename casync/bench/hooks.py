""""DDP + casync hook" rows: the grid's casync configurations run through DDP, beside PyTorch's own hooks.

A row's name is ``ddp-casync:<strategy label>:<codec spec>`` (e.g. ``ddp-casync:ps-twoway:randomk:ratio=0.01``).
It runs in the baselines' rank processes (``casync.bench.baselines``): the same model whose backward yields the
benchmark gradients, ``DistributedDataParallel`` with 25 MiB buckets, and ``casync.torch.comm_hook`` with a
``CasyncState`` of the label's ``build_plan`` arguments — the same strategy and codec as the RayEngine row, on
DDP's own buckets.  It is timed like the DDP baselines (first hook call to last bucket's future) after the
uncompressed iterations the hook starts with.  ``auto/<codec>`` has the planner choose per DDP bucket (strategy,
partitions, and whether to compress with the codec) for the setup's cluster model, which the ranks are handed,
and for the times DDP hands the buckets over in the warm-up.
"""
from __future__ import annotations

from typing import Any, Sequence

HOOK_PREFIX = "ddp-casync"
#: iterations before the hook runs its plan (DDP rebuilds its buckets in iteration 1; the plan starts at 2)
HOOK_FIRST_PLANNED_ITER = 2


def hook_variant(label: str, codec: str) -> str:
    """The row name of ``label`` (a strategy label of the grid) with ``codec`` through the DDP hook."""
    return f"{HOOK_PREFIX}:{label}:{codec}"


def is_hook(name: str) -> bool:
    return name.startswith(HOOK_PREFIX + ":")


def parse_hook_variant(name: str) -> tuple[str, str]:
    """``ddp-casync:ring:onebit`` -> ``("ring", "onebit")``; a bad name raises ValueError naming the choices."""
    parts = name.split(":", 2)
    if len(parts) != 3 or parts[0] != HOOK_PREFIX or not parts[1] or not parts[2]:
        raise ValueError(f"a DDP + casync hook row is named {HOOK_PREFIX}:<strategy label>:<codec>, got {name!r}")
    return parts[1], parts[2]


def hook_arguments(name: str, cluster: Any = None, strategies: Sequence[str] = ()) -> dict[str, Any]:
    """``CasyncState`` keyword arguments of a row (its strategy label's ``build_plan`` arguments, a ``.p<K>``
    partition count included, and codec); an ``auto`` row plans for ``cluster`` (a ``ClusterModel``; rows are
    checked without one) among the strategies of the fixed hook rows ``strategies`` (their labels;
    ``casync.bench.labels.auto_strategies``)."""
    from casync.primitives.codecs import get_codec

    from .labels import AUTO_CODEC, auto_strategies, label_arguments

    label, codec = parse_hook_variant(name)
    if "@" in label:
        raise ValueError(f"{name!r}: the DDP hook rows run on the ranks' own gloo group (no '@transport')")
    args = label_arguments(label)
    if args.get("servers") is not None:
        raise ValueError(f"{name!r}: dedicated servers do not run in a DDP job; choose co-located PS")
    if codec == AUTO_CODEC:
        raise ValueError(f"{name!r}: a DDP hook row takes one codec ('auto/onebit': the planner chooses per bucket "
                         "between it and none)")
    get_codec(None if codec == "none" else codec)  # validates, naming the registered codecs
    if args["strategy"] == "auto":
        args.update(auto_strategies(strategies))
        args["codec"] = list(dict.fromkeys(["none", codec]))
        if cluster is not None:
            args["cluster"] = cluster
    else:
        args["codec"] = "none" if codec == "none" else codec
    return args


def casync_hook(name: str, compute_threads: int = 1, cluster: Any = None, strategies: Sequence[str] = (),
                **options: Any) -> tuple[Any, Any]:
    """Inside a rank: the ``CasyncState`` and the hook of the row (the replica check off: it is not sync time),
    running ``compute_threads`` ops at once; ``cluster``: what an ``auto`` row plans for; ``options``: more
    ``CasyncState`` keyword arguments (error feedback, start_iter, the accuracy keepers)."""
    import casync.torch as ct

    args = hook_arguments(name, cluster, strategies)
    if parse_hook_variant(name)[0] == "auto" and "cluster" not in args:
        raise ValueError(f"{name!r}: an auto row plans for the setup's cluster model; none was given")
    return ct.CasyncState(**{"check_every": 0, "compute_threads": compute_threads, **args, **options}), ct.comm_hook
