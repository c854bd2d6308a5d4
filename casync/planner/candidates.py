"""What the planner may choose from: strategies, codecs and partition counts per bucket."""
from __future__ import annotations

from typing import Any

from casync.primitives.codecs import Codec, get_codec
from casync.strategies import STRATEGIES, get_strategy

from ..plan.assemble import MIN_PARTITION_NUMEL, BucketChoice, effective_partitions
from ..plan.checks import check_partitions

DEFAULT_CODECS: tuple[str, ...] = ("none", "fp16", "onebit", "topk:ratio=0.01")
#: From this many workers on, no bucket is cut in more partitions than workers: ring and PS plans have
#: O(N) ops per partition, so 2N partitions of BERT-base at 64 workers would be a 850k-op plan to build
#: for a gain the simulator did not show (the what-if table's plans at 64 workers all use N).
SCALE_WORKERS = 32


def default_strategies() -> tuple[str, ...]:
    """``strategy="auto"``: every registered strategy that opts in (``Strategy.in_auto``)."""
    return tuple(name for name, s in STRATEGIES.items() if s.in_auto)


def partition_candidates(strategy: str, workers: int, numel: int, partitions: Any) -> list[int]:
    """Partition counts to try for a bucket: the default, the given count, or (``"auto"``) the strategy's
    candidates that keep parts at least ``MIN_PARTITION_NUMEL`` elements (HiPress's partitioning rule).

    A bucket large enough to give every worker a partition is cut in whole rotations only where the strategy
    has a symmetric template (ring and PS: N or 2N partitions, never fewer): with fewer, some workers have no
    chunk to reduce or host and their links idle, and whole rotations are what the planner can simulate as
    a compact template, exactly and in O(N) ops.  From ``SCALE_WORKERS`` workers on, never more partitions
    than workers."""
    default = effective_partitions(BucketChoice(strategy=strategy), workers, numel)
    if partitions is None:
        return [default]
    if partitions != "auto":
        return [int(partitions)]
    cap = max(1, -(-numel // MIN_PARTITION_NUMEL))
    s = get_strategy(strategy)
    found = {default} | {k for k in s.partition_candidates(workers) if 1 <= k <= cap}
    if s.has_compact(None) and cap >= workers:
        whole = {k for k in found if s.compact_partitions(workers, k, k) == k}
        found = whole or found
    if workers >= SCALE_WORKERS:
        found = {k for k in found if k <= workers} or {default}
    return sorted(found)


def normalize_strategies(strategies: Any) -> tuple[str, ...]:
    if strategies == "auto" or strategies is None:
        strategies = default_strategies()
    elif isinstance(strategies, str):
        strategies = (strategies,)
    elif not isinstance(strategies, (list, tuple)):
        raise TypeError(f"strategies must be 'auto', a strategy name or a list of names, got {strategies!r}")
    elif not strategies:
        raise ValueError("strategy candidates must not be empty")
    out = []
    for s in strategies:
        get_strategy(s)  # validates, naming the choices
        if s not in out:
            out.append(s)
    return tuple(out)


def normalize_codecs(codecs: Any) -> tuple[Codec, ...]:
    if isinstance(codecs, str) and codecs == "auto":
        codecs = DEFAULT_CODECS
    elif not isinstance(codecs, list):
        codecs = [codecs]
    elif not codecs:
        raise ValueError("codec candidates must not be empty")
    out: list[Codec] = []
    for spec in codecs:
        c = get_codec(spec)
        if c not in out:
            out.append(c)
    return tuple(out)


def normalize_partitions(partitions: Any) -> Any:
    if partitions is None or partitions == "auto":
        return partitions
    return check_partitions(partitions)
