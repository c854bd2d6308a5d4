"""Selective compression as a stated rule (HiPress's SeCoPa, on the planner's estimates).

**Material gain.**  Compression is chosen only where the predicted saving is material:
``min_gain(T) = max(50 us, 1% of the iteration T)``; anything less is a tie, and ties go to no compression.

**All gradients ready together** (``ready_times=None``): there are no bubbles to hide communication in, and
the choice is a rule on size, as in SeCoPa's closed form:

* *a size threshold*: the planner orders the bucket sizes and, for k = 0, 1, 2, ..., estimates the plan that
  compresses the buckets of the k largest sizes (each with its best compressed option, the others with their
  best uncompressed one); among those it keeps the fewest sizes compressed whose estimate is within
  ``min_gain`` of the best.  So compressing a bucket implies compressing every larger one, and equal sizes
  are decided alike;
* *partitions non-decreasing with size*, per strategy: a bucket never gets fewer partitions than a smaller
  bucket of the same strategy (:func:`monotone_partitions`).

**With ready times**, a bucket whose synchronization hides in a bubble (it is done before the next gradient
is ready) gains nothing from compression and may stay uncompressed whatever its size; its note says
``hidden in bubble``.  Other compression that does not gain ``min_gain`` is undone (:func:`regularize`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from .search import Planner

from .search import min_gain


def regularize(planner: Planner, assign: Sequence[int]) -> list[list[int]]:
    """``assign`` made to follow the rule: the best size threshold (all gradients ready together, see the
    module docstring) or, with ready times, compression undone where it does not gain ``min_gain``.  Also
    the variant that undoes only compression that gains nothing at all (a bucket hidden in a bubble): it
    simulates as fast as ``assign`` itself, so it stands in for it where ``assign`` must not lose."""
    if planner.monotone:
        variants = [threshold_plan(planner, assign), threshold_plan(planner, assign, strict=True)]
    else:
        variants = [planner.simplify(list(assign)), planner.simplify(list(assign), strict=True)]
    return variants if variants[0] != variants[1] else variants[:1]


def trim(planner: Planner, assign: Sequence[int], run: Callable[[list[int]], float | None],
         limit: float) -> tuple[list[int], float, float] | None:
    """The least-compressed size threshold of ``assign`` that the simulator (``run``) puts within ``limit``:
    for k = 0, 1, 2, ... the plan that compresses only the buckets of the k largest sizes ``assign``
    compresses (the others uncompressed with the same strategy and partitions), first one found.  Where the
    estimate misjudges small buckets, this is how they stay uncompressed.  Returns (plan, its simulated
    time, the simulated time without compression), or None if no smaller threshold passes (or the budget
    runs out)."""
    packed = sorted({planner.buckets[b].numel for b, j in enumerate(assign) if j not in planner.buckets[b].baseline},
                    reverse=True)
    for k in range(len(packed)):
        cut = packed[k - 1] if k else None
        trial = []
        for b, j in enumerate(assign):
            bucket = planner.buckets[b]
            if j in bucket.baseline or (cut is not None and bucket.numel >= cut):
                trial.append(j)
            else:
                o = bucket.options[j]
                trial.append(planner.option(b, o.strategy, planner.base_codec, o.partitions))
        trial = monotone_partitions(planner, trial)
        t = run(trial)
        if t is None:
            return None
        if not k:
            plain = t
        if t <= limit:
            return trial, t, plain
    return None


def monotone_partitions(planner: Planner, assign: Sequence[int]) -> list[int]:
    """Per strategy, raise partition counts so that they never decrease with bucket size (equal sizes get
    the same count): each size takes the largest count chosen for it or any smaller size."""
    assign = list(assign)
    order = sorted(range(len(assign)), key=lambda b: planner.buckets[b].numel)
    most: dict[str, int] = {}
    i = 0
    while i < len(order):
        numel = planner.buckets[order[i]].numel
        same = [b for b in order[i:] if planner.buckets[b].numel == numel]
        i += len(same)
        by_strategy: dict[str, list[int]] = {}
        for b in same:
            by_strategy.setdefault(planner.buckets[b].options[assign[b]].strategy, []).append(b)
        for strategy, members in by_strategy.items():
            k = max([most.get(strategy, 1)] + [planner.buckets[b].options[assign[b]].partitions for b in members])
            most[strategy] = k
            for b in members:
                o = planner.buckets[b].options[assign[b]]
                if o.partitions != k:
                    assign[b] = planner.option(b, strategy, o.codec, k)
    return assign


def threshold_plan(planner: Planner, assign: Sequence[int], strict: bool = False) -> list[int]:
    """The size-threshold plan nearest ``assign`` (module docstring): every bucket keeps its strategy; those
    it compresses keep their option, the others take their best compressed one (by isolated estimate) when
    the threshold includes them.  ``strict``: fewer sizes compressed only where that costs nothing at all."""
    plain, packed = [], []
    for b, j in enumerate(assign):
        bucket = planner.buckets[b]
        o = bucket.options[j]
        if j in bucket.baseline:
            plain.append(j)
            same = [i for i, x in enumerate(bucket.options) if x.strategy == o.strategy and i not in bucket.baseline]
            packed.append(min(same, key=lambda i: (bucket.costs[i].L, bucket.costs[i].ops)) if same else None)
        else:
            packed.append(j)
            plain.append(planner.option(b, o.strategy, planner.base_codec, o.partitions))
    sizes = sorted({planner.buckets[b].numel for b in range(len(assign)) if packed[b] is not None}, reverse=True)
    plans, times = [], []
    for k in range(len(sizes) + 1):
        cut = sizes[k - 1] if k else None
        trial = [packed[b] if cut is not None and packed[b] is not None and planner.buckets[b].numel >= cut
                 else plain[b] for b in range(len(assign))]
        trial = monotone_partitions(planner, trial)
        plans.append(trial)
        times.append(planner.estimate(trial))
    best = min(range(len(plans)), key=lambda k: times[k])
    limit = times[best][0] + (max(1e-9, 1e-6 * times[best][0]) if strict else min_gain(times[best][0]))
    chosen = min(k for k in range(best + 1) if times[k][0] < limit)  # ties go to less compression
    return plans[chosen]
